"""analysis.load reads W&B runs (offline files, and the online API over the config the logger writes): the same
tables, factor columns included, as from the run store written beside them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import aggregate, tables
from analysis.frames import factor_columns
from analysis.load import load_sweep
from analysis.wandb_runs import load_wandb_offline
from analysis.wandb_runs import load_wandb
from analysis.wandb_runs import history_tables, offline_state
from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers, wandb_run_id
from dataflex_rl.tracking.identity import config_hash
from dataflex_rl.tracking.wandb_file import read_run, records

from tests.tracking import wandb_records


def log_run(run_dir, alpha: float, seed: int, lr: float | None = None) -> RunIdentity:
    """A run store plus its offline W&B run, through the project's loggers. ``lr``: the run belongs to an alpha x
    ``trainer.lr`` grid (its identity records the axes) and its score is ``alpha * (1 + 1000 lr) + step / 10``."""
    axes = {"alpha": alpha, "trainer.lr": lr, "seed": seed} if lr is not None else {}
    run = f"a{alpha:g}-s{seed}" + (f"-lr{lr:g}" if lr is not None else "")
    resolved = {"trainer": {"lr": lr if lr is not None else 0.01}}
    identity = RunIdentity(sweep="wsweep", run=run, backend="local", mechanism="reweight",
                           alpha=alpha, seed=seed, config_hash=config_hash(resolved), git_commit=None, axes=axes)
    config = {"hist_every": 1, "console_every": 100, "wandb": {"mode": "offline", "project": "p", "entity": None,
                                                                 "tags": []}}
    store = RunStore(run_dir)
    store.write_config(resolved)  # the run's record: its identity is its config's
    store.write_meta(identity)
    effect = 1 + 1000 * lr if lr is not None else 1
    with build_loggers(config, store, identity, resolved) as loggers:
        for step in range(3):
            loggers.log_metrics(step, {keys.SCORE_MEAN: alpha * effect + step / 10, keys.VAL_ACCURACY: seed / 10})
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
    # runs logged before axes were recorded: alpha and seed only, no factor columns
    assert factor_columns(offline.runs) == [] and factor_columns(offline.metrics) == []


@pytest.fixture(scope="module")
def two_factor_sweep(tmp_path_factory):
    """alpha (0, 0.5) x trainer.lr (1e-4, 3e-4), one seed: four run stores, each with its offline W&B run."""
    root = tmp_path_factory.mktemp("two-factor") / "wsweep"
    for lr in (1e-4, 3e-4):
        for alpha in (0.0, 0.5):
            log_run(root / f"a{alpha:g}-s1-lr{lr:g}", alpha, 1, lr=lr)
    return root


def score_deltas(data) -> pd.DataFrame:
    """alpha = 0.5 against alpha = 0 at the same lr, paired on seed, of the final score."""
    summaries = aggregate.run_summaries(data.metrics, metrics=[keys.SCORE_MEAN], final_window=1)
    group_keys = aggregate.default_group_keys(data.runs)
    assert group_keys == ("alpha", "trainer.lr")
    deltas = aggregate.paired_differences(summaries, group_keys=group_keys, baseline={"alpha": 0.0})
    return deltas[["alpha", "trainer.lr", "n_pairs", "mean_difference"]].sort_values("trainer.lr")


def test_offline_runs_carry_the_recorded_axes_as_factor_columns(two_factor_sweep):
    offline = load_wandb_offline(two_factor_sweep)
    assert factor_columns(offline.runs) == ["trainer.lr"]
    assert list(offline.metrics.columns) == [*list(offline.metrics.columns[:6]), "trainer.lr", "seed", "step",
                                             "metric", "value"]
    assert offline.runs.set_index("run")["trainer.lr"].to_dict() == {
        "a0-s1-lr0.0001": 1e-4, "a0.5-s1-lr0.0001": 1e-4, "a0-s1-lr0.0003": 3e-4, "a0.5-s1-lr0.0003": 3e-4}
    assert sorted(offline.histograms["trainer.lr"].tolist()) == [1e-4, 1e-4, 3e-4, 3e-4]
    deltas = score_deltas(offline)
    # final score alpha * (1 + 1000 lr) + 0.2: the delta of alpha 0.5 is 0.5 * 1.1 at lr 1e-4 and 0.5 * 1.3 at 3e-4
    assert deltas["trainer.lr"].tolist() == [1e-4, 3e-4] and deltas["n_pairs"].tolist() == [1, 1]
    np.testing.assert_allclose(deltas["mean_difference"], [0.55, 0.65])
    pd.testing.assert_frame_equal(deltas.reset_index(drop=True),
                                  score_deltas(load_sweep(two_factor_sweep)).reset_index(drop=True))
    # the comparison table: one row per (alpha, lr), the delta against alpha = 0 at the same lr
    summaries = aggregate.run_summaries(offline.metrics, metrics=[keys.SCORE_MEAN], final_window=1)
    group_keys = aggregate.default_group_keys(offline.runs)
    table = tables.comparison_table(
        aggregate.aggregate_runs(summaries, group_keys=group_keys), group_keys=group_keys,
        deltas=aggregate.paired_differences(summaries, group_keys=group_keys, baseline={"alpha": 0.0}))
    delta_cells = table.cells[tables.DELTA_PREFIX + keys.SCORE_MEAN].tolist()
    assert table.cells[["alpha", "trainer.lr"]].values.tolist() == [
        ["0", "0.0001"], ["0", "0.0003"], ["0.5", "0.0001"], ["0.5", "0.0003"]]
    assert delta_cells[:2] == ["baseline", "baseline"]
    assert delta_cells[2].startswith("+0.550") and delta_cells[3].startswith("+0.650")


class _ApiRun:
    """A ``wandb.Api`` run holding what the W&B logger sent for one of the offline runs (config, name, group)."""

    def __init__(self, path, rows: list[dict[str, Any]]) -> None:
        offline = read_run(path)
        self.name, self.id, self.group, self.tags = offline.name, offline.run_id, offline.group, list(offline.tags)
        self.config, self.state, self.summary, self.created_at = offline.config, "finished", {}, None
        self._rows = rows

    def scan_history(self, page_size: int = 1000) -> list[dict[str, Any]]:
        return list(self._rows)


class _Api:
    def __init__(self, runs: list[_ApiRun]) -> None:
        self.fake_runs = runs

    def runs(self, path: str, filters: Any = None) -> list[_ApiRun]:
        return self.fake_runs


def test_online_runs_carry_the_recorded_axes_as_factor_columns(two_factor_sweep, tmp_path):
    store = load_sweep(two_factor_sweep)
    api_runs = []
    for run_dir in sorted(two_factor_sweep.iterdir()):
        path = next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        values = store.metrics[(store.metrics["run"] == run_dir.name) & (store.metrics["metric"] == keys.SCORE_MEAN)]
        api_runs.append(_ApiRun(path, [{"_step": int(s), keys.SCORE_MEAN: float(v)}
                                       for s, v in zip(values["step"], values["value"], strict=True)]))
    online = load_wandb("team", "p", api=_Api(api_runs), cache_dir=tmp_path / "cache")
    assert factor_columns(online.runs) == ["trainer.lr"]
    assert online.runs.set_index("run")["trainer.lr"].to_dict() == store.runs.set_index("run")["trainer.lr"].to_dict()
    np.testing.assert_allclose(score_deltas(online)["mean_difference"], [0.55, 0.65])
    cached = load_wandb("team", "p", api=_Api([]), cache_dir=tmp_path / "cache")  # the cache keeps the factor
    assert factor_columns(cached.metrics) == ["trainer.lr"]
    np.testing.assert_allclose(score_deltas(cached)["mean_difference"], [0.55, 0.65])


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


@pytest.mark.slow
def test_a_real_alpha_by_lr_sweep_loads_from_its_wandb_files_like_from_its_run_stores(tmp_path):
    """``python -m sweeps`` (2 x 2: alpha x trainer.lr, one seed, 2 steps, W&B offline): the offline W&B files give
    the same factor columns, runs and paired deltas as the run stores beside them."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    extra = ("extra=[trainer.val_every=1 trainer.prompts_per_step=4 trainer.rollouts_per_prompt=2 trainer.val_size=8 "
             f"sft.steps=2 stats.exact_every=0 sft.cache_dir={tmp_path / 'sft'} logger.wandb.mode=offline "
             "trainer.lr=1e-4,3e-4]")
    subprocess.run([sys.executable, "-m", "sweeps", "alpha=0.0,0.5", "seeds=1", "steps=2", "jobs=2",
                    f"root={tmp_path / 'runs'}", "name=real", extra], cwd=repo, check=True, timeout=1200)
    sweep_dir = tmp_path / "runs" / "real"
    store, offline = load_sweep(sweep_dir), load_wandb_offline(sweep_dir)
    assert factor_columns(offline.runs) == factor_columns(store.runs) == ["trainer.lr"]
    assert sorted(offline.runs["run"].astype(str)) == sorted(store.runs["run"].astype(str))
    assert offline.runs["included"].all() and len(offline.runs) == 4

    def deltas(data):
        summaries = aggregate.run_summaries(data.metrics, metrics=[keys.VAL_ACCURACY])
        group_keys = aggregate.default_group_keys(data.runs)
        assert group_keys == ("alpha", "trainer.lr")
        frame = aggregate.paired_differences(summaries, group_keys=group_keys, baseline={"alpha": 0.0},
                                             n_bootstrap=20)
        return frame[["alpha", "trainer.lr", "n_pairs", "mean_difference"]].reset_index(drop=True)

    from_wandb = deltas(offline)
    assert from_wandb["trainer.lr"].tolist() == [1e-4, 3e-4] and from_wandb["n_pairs"].tolist() == [1, 1]
    pd.testing.assert_frame_equal(from_wandb, deltas(store))
