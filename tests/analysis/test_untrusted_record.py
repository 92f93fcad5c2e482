"""The record is trusted only when it can be read (issue: the record under hostile use, family 2): every file the
driver or the analysis reads is checked against its schema, and what fails it is named and excluded or refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis import load, report
from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.run_store import verify
from sweeps import seed_plan
from sweeps.manifest import Manifest, ManifestError
from sweeps.runner import record_state
from tests.analysis.synthetic import write_fake_run

HEADER = {"sweep": "s", "backend": "local", "grid": {"alpha": [0.0, 0.5], "seed": [1]}}


def write_sweep(sweep: Path, runs=(("a0.0-s1", 0.0, 1), ("a0.5-s1", 0.5, 1), ("a0.0-s2", 0.0, 2),
                                   ("a0.5-s2", 0.5, 2))) -> list[Path]:
    paths = [write_fake_run(sweep / name, sweep=sweep.name, run=name, alpha=alpha, seed=seed,
                            metrics={"val/accuracy": [0.2, 0.3, 0.4 + alpha / 10]}, steps=[0, 10, 20])
             for name, alpha, seed in runs]
    run_store.atomic_write_json(sweep / run_store.SWEEP_FILE, {"sweep": sweep.name, "grid": HEADER["grid"], "runs": [
        {"run": name, "state": "completed", "alpha": alpha, "seed": seed} for name, alpha, seed in runs]})
    return paths


def test_a_run_written_into_a_sweep_folder_by_hand_is_not_pooled_into_its_report(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    write_sweep(sweep)
    write_fake_run(sweep / "intruder", sweep="single", run="intruder", alpha=0.5, seed=3,
                   metrics={"val/accuracy": [0.9, 0.9, 0.9]}, steps=[0, 10, 20])
    runs = load.load_sweep(sweep).runs.set_index("run")
    assert not runs.loc["intruder", "included"]
    assert "not a run of sweep s: its sweep.json does not list intruder" in runs.loc["intruder", "exclusion_reason"]
    assert runs.drop(index="intruder")["included"].all()


def test_a_completed_run_whose_parquet_is_damaged_and_jsonl_gone_is_untrusted_by_driver_and_report(tmp_path) -> None:
    sweep = tmp_path / "s"
    damaged = write_sweep(sweep)[1]
    (damaged / "metrics.parquet").write_bytes(b"PAR1 not a parquet file")
    completed, reasons = record_state(damaged, False, {"state": "completed", "exit_code": 0})
    assert not completed and reasons and "unreadable metrics.parquet" in reasons[0]
    runs = load.load_sweep(sweep).runs.set_index("run")
    assert not runs.loc["a0.5-s1", "included"]
    assert "unreadable metrics.parquet" in runs.loc["a0.5-s1", "exclusion_reason"]


def test_a_status_step_no_integer_holds_excludes_the_run_naming_file_key_and_value(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    run = write_sweep(sweep)[2]
    (run / "status.json").write_text('{"state": "completed", "step": 1e999}')
    runs = load.load_sweep(sweep).runs.set_index("run")
    assert not runs.loc["a0.0-s2", "included"]
    assert "status.json: step = inf is not allowed: it must be an integer >= 0" in runs.loc["a0.0-s2",
                                                                                           "exclusion_reason"]
    assert report.main([str(sweep), "--bootstrap", "100"]) == 0


@pytest.mark.parametrize("record, named", [
    ({"runs": [{"state": "completed"}]}, "runs = [{'state': 'completed'}] is not allowed: it must be a list of "
                                         "objects each with run (entry 0 lacks 'run')"),
    ({"runs": [{"run": 5}]}, "each with run (entry 0 holds 5, not a non-empty string, in 'run')"),
    ({"runs": "x"}, "runs = 'x' is not allowed: it must be a list of JSON objects"),
    ({"invocations": None}, "invocations = None is not allowed: it must be a list of JSON objects"),
    ({"grid": [1, 2]}, "grid = [1, 2] is not allowed: it must be a JSON object"),
])
def test_a_sweep_json_that_fails_its_schema_is_refused_by_the_driver_naming_the_key(tmp_path, record, named) -> None:
    sweep = tmp_path / "s"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"sweep": "s", **record}))
    with pytest.raises(ManifestError) as refused:
        Manifest(sweep, HEADER)
    assert named in str(refused.value) and "sweep.json" in str(refused.value)


def test_a_meta_json_without_its_fingerprint_is_refused_naming_meta_json(tmp_path: Path) -> None:
    run = write_sweep(tmp_path / "s")[0]
    meta = json.loads((run / "meta.json").read_text())
    del meta["config_fingerprint"]
    (run / "meta.json").write_text(json.dumps(meta))
    (reason,) = verify.verify_run(run)
    assert reason.startswith("meta.json records no config_fingerprint")


def test_a_run_whose_last_evaluations_are_not_finite_has_no_final_value_and_is_named(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    runs = write_sweep(sweep)
    write_fake_run(runs[3], sweep="s", run="a0.5-s2", alpha=0.5, seed=2, metrics_format="jsonl", steps=[0, 10, 20],
                   metrics={"val/accuracy": [0.2, 0.3, 0.45]})
    jsonl = runs[3] / "metrics.jsonl"
    jsonl.write_text(jsonl.read_text() + '{"step": 30, "val/accuracy": NaN}\n{"step": 40, "val/accuracy": Infinity}\n')
    data = load.load_sweep(sweep)
    assert set(data.metrics[data.metrics["run"] == "a0.5-s2"]["metric"]) == set()  # not from steps 0 to 20
    assert data.runs.set_index("run").loc["a0.5-s2", "nonfinite"] == "val/accuracy at step(s) 30, 40"
    assert report.main([str(sweep), "--bootstrap", "100"]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "Run a0.5-s2 logged NaN or infinite values of val/accuracy at step(s) 30, 40" in text
    assert np.isfinite(data.metrics["value"]).all()


def test_a_plan_from_differences_without_spread_says_so_instead_of_an_mde_of_zero() -> None:
    comparison = {"group": {"alpha": 0.5}, "n_pairs": 2, "mean_difference": 0.0, "std_difference": 0.0, "mde": 0.0}
    cells = seed_plan.judge_cells([comparison], [], 1e-300, 3)
    record = {"metric": "val/accuracy", "target_mde": 1e-300, "max_seeds": 3, "looks": [cells]}
    text = seed_plan.describe_look(record)
    assert "no spread: every paired difference is the same" in text and "0.0000" not in text and "done" in text
