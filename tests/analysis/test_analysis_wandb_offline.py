"""analysis.load reads offline W&B run files: the same tables as from the run store written beside them."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.load import load_sweep, load_wandb_offline
from analysis.wandb_offline import history_tables, offline_state
from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers, wandb_run_id
from dataflex_rl.tracking.wandb_offline import read_run, records

from tests.tracking import wandb_records


def log_run(run_dir, alpha: float, seed: int) -> RunIdentity:
    identity = RunIdentity(sweep="wsweep", run=f"a{alpha:g}-s{seed}", backend="local", mechanism="reweight",
                           alpha=alpha, seed=seed, config_hash="0123456789ab", git_commit=None)
    config = {"hist_every": 1, "console_every": 100, "wandb": {"mode": "offline", "project": "p", "entity": None,
                                                                 "tags": []}}
    store = RunStore(run_dir)
    store.write_meta(identity)
    with build_loggers(config, store, identity, {"trainer": {"lr": 0.01}}) as loggers:
        for step in range(3):
            loggers.log_metrics(step, {keys.SCORE_MEAN: alpha + step / 10, keys.VAL_ACCURACY: seed / 10})
        loggers.log_histogram(2, keys.HIST_WEIGHT, np.array([0.0, 1.0, 2.0]), np.array([5, 7]))
    wandb_records.run_file(run_dir, wandb_run_id(identity))  # the exit record is written
    return identity


def test_offline_runs_load_like_the_run_store(tmp_path):
    for alpha in (0.0, 0.5):
        log_run(tmp_path / "wsweep" / f"a{alpha:g}-s1", alpha, 1)
    offline = load_wandb_offline(tmp_path / "wsweep")
    store = load_sweep(tmp_path / "wsweep")
    assert offline.runs["state"].tolist() == ["completed", "completed"]
    assert offline.runs[["sweep", "run", "alpha", "seed"]].astype(str).values.tolist() == [
        ["wsweep", "a0-s1", "0.0", "1"], ["wsweep", "a0.5-s1", "0.5", "1"]]
    columns = ["run", "step", "metric", "value"]
    left = offline.metrics[columns].astype({"run": str, "metric": str}).reset_index(drop=True)
    right = store.metrics[columns].astype({"run": str, "metric": str}).reset_index(drop=True)
    assert left.equals(right)
    histogram = offline.histograms.iloc[0]
    assert histogram["name"] == keys.HIST_WEIGHT and histogram["step"] == 2
    np.testing.assert_array_equal(histogram["counts"], [5, 7])
    assert offline.runs["config.trainer.lr"].tolist() == [0.01, 0.01]


def test_offline_reader_parts(tmp_path):
    identity = log_run(tmp_path / "run", 0.5, 2)
    path = wandb_records.run_file(tmp_path / "run", wandb_run_id(identity))
    run = read_run(path)
    assert (run.name, run.group, run.exit_code) == ("wsweep-a0.5-s2", "wsweep", 0)
    assert run.config["run_identity"]["seed"] == 2
    assert [offline_state(code) for code in (None, 0, 1, 130)] == ["running", "completed", "failed", "interrupted"]
    metrics, histograms = history_tables({0: {"a": 1.0, "b": True}, 3: {"a": 2, "h/_type": "histogram",
                                                                       "h/bins": [0, 1], "h/values": [4]}})
    assert metrics.names == ("a",) and metrics.steps.tolist() == [0, 3]
    np.testing.assert_array_equal(metrics.values, [[1.0, 2.0]])
    assert histograms[0]["name"] == "h" and histograms[0]["counts"].tolist() == [4.0]
    (tmp_path / "not.wandb").write_bytes(b"garbage!")
    with pytest.raises(ValueError, match="not a W&B run file"):
        list(records(tmp_path / "not.wandb"))
