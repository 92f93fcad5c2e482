"""Sweep-level parquet files: one read_parquet has the whole sweep with its identity and factors on every row."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.export import export_sweep, write_sweep_tables
from analysis.load import load_sweep
from analysis.report import build_report
from tests.analysis.synthetic import write_fake_run, write_fake_sweep
from dataflex_rl import keys


def test_metrics_and_runs_parquet_carry_identity_and_every_swept_factor(tmp_path):
    sweep_dir = tmp_path / "lr-sweep"
    runs = []
    for lr in (0.001, 0.01):
        for seed in (1, 2):
            name = f"lr{lr:g}-s{seed}"
            write_fake_run(sweep_dir / name, metrics={keys.VAL_ACCURACY: [0.1 * seed, lr]}, steps=[0, 10],
                           sweep="lr-sweep", run=name, alpha=0.5, seed=seed,
                           config={"seed": seed, "trainer": {"lr": lr}}, state="completed",
                           axes={"alpha": 0.5, "trainer.lr": lr, "seed": seed})
            runs.append({"run": name, "state": "completed", "alpha": 0.5, "seed": seed})
    write_fake_run(sweep_dir / "broken", metrics={keys.VAL_ACCURACY: [0.0]}, sweep="lr-sweep", run="broken",
                   alpha=0.5, seed=3, state="failed", error="boom", config={"trainer": {"lr": 0.1}},
                   axes={"alpha": 0.5, "trainer.lr": 0.1, "seed": 3})
    (sweep_dir / "sweep.json").write_text(json.dumps({"sweep": "lr-sweep", "runs": runs, "grid": {
        "alpha": [0.5], "seed": [1, 2], "eta": [], "axes": {"trainer.lr": [0.001, 0.01]}}}))

    paths = export_sweep(sweep_dir)
    metrics = pd.read_parquet(paths["metrics"])
    assert list(metrics.columns) == ["sweep", "run", "backend", "mechanism", "mechanism_label", "alpha", "trainer.lr",
                                     "seed", "step", "metric", "value"]
    assert len(metrics) == 8 and set(metrics["run"]) == {"lr0.001-s1", "lr0.001-s2", "lr0.01-s1", "lr0.01-s2"}
    row = metrics[(metrics["run"] == "lr0.01-s2") & (metrics["step"] == 10)].iloc[0]
    assert (row["sweep"], row["alpha"], row["trainer.lr"], row["seed"], row["metric"], row["value"]) == (
        "lr-sweep", 0.5, 0.01, 2, keys.VAL_ACCURACY, 0.01)
    by_lr = metrics[metrics["step"] == 0].groupby("trainer.lr")["value"].mean()  # a join-free group-by
    np.testing.assert_allclose(by_lr.to_numpy(), [0.15, 0.15])
    runs_table = pd.read_parquet(paths["runs"])
    assert len(runs_table) == 5 and runs_table.set_index("run").loc["broken", "state"] == "failed"
    assert not runs_table.set_index("run").loc["broken", "included"]
    assert "config.trainer.lr" in runs_table.columns


def test_the_report_writes_the_sweep_tables_but_never_into_a_run_folder(tmp_path):
    sweep_dir = write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1,), n_steps=10, histograms=False)
    build_report(sweep_dir)
    metrics = pd.read_parquet(sweep_dir / "metrics.parquet")
    assert set(metrics["alpha"]) == {0.0, 0.5} and metrics["seed"].tolist()[0] == 1
    assert load_sweep(sweep_dir).runs.shape[0] == 2  # the sweep-level files are not taken for runs
    run_dir = next(sweep_dir.glob("s-a0-s1"))
    before = (run_dir / "metrics.parquet").read_bytes()
    with pytest.raises(ValueError, match="run folder"):
        write_sweep_tables(load_sweep(run_dir), run_dir)
    build_report(run_dir, tmp_path / "one-run-report")
    assert (run_dir / "metrics.parquet").read_bytes() == before
