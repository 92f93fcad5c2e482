"""Analysis reads run stores through the run store's reader API, fakes are written through ``RunStore``, and the
report refuses a folder with no run store (issue 11)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis import load, report
from tests.analysis.synthetic import write_fake_run
from dataflex_rl.tracking import RunStore, run_store
from dataflex_rl.tracking.identity import config_hash

from tests.tracking.identities import make_identity


@pytest.mark.parametrize("folder", ["empty", "not-a-sweep"])
def test_report_refuses_a_folder_with_no_run_store(tmp_path: Path, folder: str, capsys) -> None:
    target = tmp_path / folder
    target.mkdir()
    if folder == "not-a-sweep":
        (target / "notes.txt").write_text("hello")
        (target / "sub").mkdir()
    assert report.main([str(target)]) == 2
    error = capsys.readouterr().err
    assert f"{target} holds no run store" in error and "meta.json" in error
    assert not (target / "report").exists()


def test_a_fake_run_is_a_run_store_its_readers_accept(tmp_path: Path) -> None:
    run_dir = write_fake_run(tmp_path / "r", metrics={"val/accuracy": [0.25, np.nan, 0.75]}, alpha=0.5, seed=3,
                             wall_time_s=12.5)
    assert run_store.read_status(run_dir)["state"] == "completed"
    meta = run_store.read_meta(run_dir)
    assert meta["config_fingerprint"] == run_store.config_fingerprint(run_store.read_config(run_dir))
    assert meta["wall_time_s"] == 12.5 and (meta["alpha"], meta["seed"]) == (0.5, 3)
    assert run_store.read_curve(run_dir, "val/accuracy").to_dict() == {0: 0.25, 2: 0.75}


def test_a_run_written_by_the_store_loads_with_its_identity_and_curves(tmp_path: Path) -> None:
    run_dir = tmp_path / "sweep1" / "a0.5-s1"
    store = RunStore(run_dir)
    config = {"seed": 1, "trainer": {"lr": 0.1}}
    store.write_config(config)
    store.write_meta(make_identity(config_hash=config_hash(config)))  # the identity of the config it recorded
    store.set_status("running", step=0)
    for step in range(3):
        store.log_metrics(step, {"val/accuracy": 0.1 * step, "grad_norm/by_prob/low": 1.0 + step})
    store.log_histogram(2, "dataflex/hist/weight", [0.0, 0.5, 1.0], [2, 3])
    store.close()
    data = load.load_sweep(tmp_path / "sweep1", metrics=["grad_norm/by_prob/*"])
    row = data.runs.iloc[0]
    assert (row["run"], row["alpha"], row["seed"], row["state"], row["config.trainer.lr"]) == (
        "a0.5-s1", 0.5, 1, "completed", 0.1)
    assert data.metric_names == ["grad_norm/by_prob/low"]  # the glob selected one column
    assert data.metrics["value"].tolist() == [1.0, 2.0, 3.0]
    assert data.histograms["counts"].iloc[0].tolist() == [2.0, 3.0]
