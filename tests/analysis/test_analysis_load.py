"""Loading run stores (parquet, jsonl fallback, damaged runs) and W&B (stand-in Api) into the long table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from analysis import frames, load, wandb_runs
from tests.analysis.synthetic import write_fake_run
from dataflex_rl import keys


def _two_metric_run(run_dir: Path, metrics_format: str = "parquet", **kwargs: Any) -> Path:
    return write_fake_run(
        run_dir, steps=[0, 10, 20], metrics={"val/accuracy": [0.1, np.nan, 0.3], "critic/score/mean": [1.0, 2.0, 3.0]},
        metrics_format=metrics_format, **kwargs)


def test_long_table_columns_dtypes_and_order(complete_sweep: Path) -> None:
    data = load.load_sweep(complete_sweep)
    long = data.metrics
    assert tuple(long.columns) == frames.LONG_COLUMNS
    assert long["step"].dtype == np.int64 and long["value"].dtype == np.float64
    assert long["seed"].dtype == "Int64" and long["alpha"].dtype == np.float64
    assert all(isinstance(long[c].dtype, pd.CategoricalDtype) for c in (*frames.CATEGORY_COLUMNS, "metric"))
    assert np.isfinite(long["value"]).all()
    # val/accuracy is logged every 5 steps of 30 plus the last step: 7 rows per run, NaN steps dropped.
    assert (long[long["metric"] == keys.VAL_ACCURACY].groupby("run", observed=True).size() == 7).all()
    assert len(data.runs) == 9 and data.runs["included"].all()  # 3 alphas x 3 seeds
    # ordered by run, then metric, then step
    for _, rows in long.groupby(["run", "metric"], observed=True):
        assert np.all(np.diff(rows["step"].to_numpy()) > 0)
        assert np.all(np.diff(rows.index.to_numpy()) == 1)


def test_values_round_trip_exactly(tmp_path: Path) -> None:
    _two_metric_run(tmp_path / "s" / "r1", alpha=0.25, seed=7, sweep="s", run="r1")
    data = load.load_sweep(tmp_path / "s")
    long = data.metrics
    assert sorted(long["metric"].astype(str).unique()) == ["critic/score/mean", "val/accuracy"]
    accuracy = long[long["metric"] == "val/accuracy"]
    assert accuracy["step"].tolist() == [0, 20] and accuracy["value"].tolist() == [0.1, 0.3]
    assert set(long["alpha"]) == {0.25} and set(long["seed"]) == {7}
    assert data.runs.loc[0, "config.dataflex.actuator.params.alpha"] == 0.25
    assert data.runs.loc[0, "git_commit"] and data.runs.loc[0, "wall_time_s"] == 60.0


def test_failed_running_and_pending_runs_are_excluded_and_explained(fake_sweep: Path) -> None:
    data = load.load_sweep(fake_sweep)
    excluded = data.excluded_runs.set_index("run")
    name = fake_sweep.name
    assert set(excluded.index) == {f"{name}-a0.5-s2", f"{name}-a1-s3", f"{name}-a1-s1"}
    assert excluded.loc[f"{name}-a0.5-s2", "state"] == "failed"
    assert "loss became NaN" in excluded.loc[f"{name}-a0.5-s2", "exclusion_reason"]
    assert excluded.loc[f"{name}-a1-s3", "exclusion_reason"] == "state running"
    assert "no run folder" in excluded.loc[f"{name}-a1-s1", "exclusion_reason"]
    assert set(data.metrics["run"].astype(str)) == set(data.included_runs["run"])
    assert not set(data.metrics["run"].astype(str)) & set(excluded.index)
    assert set(data.histograms["run"].astype(str)) <= set(data.included_runs["run"])


def test_include_incomplete_loads_failed_and_running_runs_from_jsonl(fake_sweep: Path) -> None:
    data = load.load_sweep(fake_sweep, include_incomplete=True)
    runs = data.runs.set_index("run")
    failed = f"{fake_sweep.name}-a0.5-s2"
    assert runs.loc[failed, "included"] and runs.loc[failed, "state"] == "failed"
    assert runs.loc[failed, "metrics_source"] == "jsonl"
    assert data.metrics[data.metrics["run"] == failed]["step"].max() == 14  # stopped half way through 30 steps
    assert not runs.loc[f"{fake_sweep.name}-a1-s1", "included"]  # pending: nothing to load


def test_jsonl_fallback_matches_parquet(tmp_path: Path) -> None:
    _two_metric_run(tmp_path / "p" / "r", sweep="p", run="r")
    _two_metric_run(tmp_path / "j" / "r", metrics_format="jsonl", sweep="j", run="r")
    from_parquet = load.load_sweep(tmp_path / "p").metrics
    from_jsonl = load.load_sweep(tmp_path / "j").metrics
    columns = ["metric", "step", "value"]
    pd.testing.assert_frame_equal(from_parquet[columns].astype({"metric": str}),
                                  from_jsonl[columns].astype({"metric": str}))


def test_jsonl_truncated_line_and_repeated_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1.0}\ngarbage\n{"step": 1, "a": 2.0}\n{"step": 1, "a": 5.0, "b": "text"}\n'
                    '{"step": 2, "a"')
    metrics = load.read_run_metrics(tmp_path, source="jsonl")
    assert metrics.steps.tolist() == [0, 1]
    assert metrics.values[metrics.names.index("a")].tolist() == [1.0, 5.0]  # the repeated step keeps its last line
    assert np.isnan(metrics.values[metrics.names.index("b")]).all()  # non-numeric value dropped
    assert "skipped 1 unreadable line" in caplog.text and "dropped a partial last line" in caplog.text


def test_damaged_parquet_falls_back_to_jsonl_or_is_excluded(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    _two_metric_run(sweep / "with-jsonl", metrics_format="both", sweep="s", run="with-jsonl", seed=1)
    _two_metric_run(sweep / "parquet-only", sweep="s", run="parquet-only", seed=2)
    _two_metric_run(sweep / "healthy", sweep="s", run="healthy", seed=3)
    for name in ("with-jsonl", "parquet-only"):
        (sweep / name / "metrics.parquet").write_bytes(b"not a parquet file")
    data = load.load_sweep(sweep)
    runs = data.runs.set_index("run")
    assert runs.loc["with-jsonl", "included"] and runs.loc["with-jsonl", "metrics_source"] == "jsonl"
    assert not runs.loc["parquet-only", "included"]
    assert "unreadable metrics.parquet" in runs.loc["parquet-only", "exclusion_reason"]
    assert runs.loc["healthy", "included"]
    assert set(data.metrics["run"].astype(str)) == {"with-jsonl", "healthy"}


def test_unreadable_meta_is_excluded_not_fatal(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    _two_metric_run(sweep / "good", sweep="s", run="good")
    _two_metric_run(sweep / "bad", sweep="s", run="bad", seed=1)
    (sweep / "bad" / "meta.json").write_text("{not json")
    data = load.load_sweep(sweep)
    runs = data.runs.set_index("run")
    assert not runs.loc["bad", "included"] and "unreadable meta.json" in runs.loc["bad", "exclusion_reason"]
    assert runs.loc["good", "included"]


def test_manifest_fills_identity_and_is_optional(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    run_dir = _two_metric_run(sweep / "r1", sweep="s", run="r1")
    meta = json.loads((run_dir / "meta.json").read_text())
    del meta["alpha"], meta["seed"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    assert np.isnan(load.load_sweep(sweep).runs.loc[0, "alpha"])  # no sweep.json: alpha unknown, still loads
    (sweep / "sweep.json").write_text(json.dumps({"sweep": "s", "runs": [{"run": "r1", "alpha": 0.75, "seed": 4}]}))
    runs = load.load_sweep(sweep).runs
    assert runs.loc[0, "alpha"] == 0.75 and runs.loc[0, "seed"] == 4


def test_metric_globs_and_list_of_run_folders(complete_sweep: Path) -> None:
    run_dirs = load.find_run_dirs(complete_sweep)[:2]
    data = load.load_runs(run_dirs, metrics=["grad_norm/by_prob/*/logit_grad_norm_share", keys.VAL_ACCURACY])
    names = data.metric_names
    assert keys.VAL_ACCURACY in names and len(names) == 5
    assert all(n == keys.VAL_ACCURACY or n.endswith("/logit_grad_norm_share") for n in names)
    assert data.runs["run"].nunique() == 2


def test_histograms_from_parquet_and_jsonl(tmp_path: Path) -> None:
    record = {"step": 3, "name": keys.HIST_WEIGHT, "edges": [0.0, 0.5, 1.0], "counts": [4, 6]}
    for metrics_format in ("parquet", "jsonl"):
        _two_metric_run(tmp_path / metrics_format / "r", metrics_format=metrics_format, histograms=[record],
                        sweep=metrics_format, run="r")
        histograms = load.load_sweep(tmp_path / metrics_format).histograms
        assert tuple(histograms.columns) == frames.HISTOGRAM_COLUMNS
        assert len(histograms) == 1 and histograms.loc[0, "step"] == 3
        assert histograms.loc[0, "edges"].tolist() == [0.0, 0.5, 1.0]
        assert histograms.loc[0, "counts"].tolist() == [4.0, 6.0]


def test_resolve_sweep_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    older = _two_metric_run(tmp_path / "runs" / "old" / "r", sweep="old", run="r")
    newer = _two_metric_run(tmp_path / "runs" / "new" / "r", sweep="new", run="r")
    import os
    os.utime(older / "meta.json", (1_000_000, 1_000_000))
    os.utime(newer / "meta.json", (2_000_000, 2_000_000))
    monkeypatch.delenv(load.SWEEP_DIR_ENV, raising=False)
    (tmp_path / "notebooks").mkdir()
    assert load.resolve_sweep_dir(start=tmp_path / "notebooks") == tmp_path / "runs" / "new"
    monkeypatch.setenv(load.SWEEP_DIR_ENV, str(tmp_path / "runs" / "old"))
    assert load.resolve_sweep_dir(start=tmp_path) == tmp_path / "runs" / "old"
    monkeypatch.setenv(load.SWEEP_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        load.resolve_sweep_dir()


# --- W&B, against a stand-in for wandb.Api -----------------------------------------------------------------------


class _FakeRun:
    def __init__(self, name: str, state: str, config: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        self.name, self.id, self.state, self.config = name, f"id-{name}", state, config
        self.group, self.tags, self.summary, self.created_at = "grp", ["reweight", "local"], {"_runtime": 12.5}, "t0"
        self._rows = rows
        self.scans = 0

    def scan_history(self, page_size: int = 1000) -> list[dict[str, Any]]:
        self.scans += 1
        return list(self._rows)


def _fake_wandb_runs() -> list[_FakeRun]:
    histogram = {"_type": "histogram", "bins": [0.0, 0.5, 1.0], "values": [3, 1]}
    rows = [
        {"_step": 0, "_runtime": 1.0, "val/accuracy": 0.2, "critic/score/mean": 0.5, keys.HIST_WEIGHT: histogram},
        {"_step": 1, "critic/score/mean": 0.6, "note": "text"},
        {"_step": 2, "val/accuracy": 0.4, "critic/score/mean": 0.7},
    ]
    return [
        _FakeRun("grp-a0.5-s3", "finished", {"dataflex": {"mechanism": "reweight"}, "lr": [1, 2]}, rows),
        _FakeRun("grp-a0-s1", "finished", {"run_identity": {"run": "folder-0", "alpha": 0.0, "seed": 1,
                                                            "git_commit": "abc"}}, rows[:2]),
        _FakeRun("grp-a1-s1", "crashed", {}, rows),
    ]


class _FakeApi:
    calls: ClassVar[list[tuple[str, Any]]] = []

    def __init__(self) -> None:
        self.fake_runs = _fake_wandb_runs()

    def runs(self, path: str, filters: Any = None) -> list[_FakeRun]:
        _FakeApi.calls.append((path, filters))
        return self.fake_runs


def test_wandb_load_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    _FakeApi.calls = []
    monkeypatch.setattr(wandb, "Api", _FakeApi)
    data = wandb_runs.load_wandb("team", "proj", group="grp", cache_dir=tmp_path / "cache")
    assert _FakeApi.calls == [("team/proj", {"group": "grp"})]
    runs = data.runs.set_index("run")
    assert runs.loc["grp-a0.5-s3", "alpha"] == 0.5 and runs.loc["grp-a0.5-s3", "seed"] == 3  # from the run name
    assert runs.loc["folder-0", "git_commit"] == "abc" and runs.loc["folder-0", "seed"] == 1  # from run_identity
    assert runs.loc["grp-a0.5-s3", "mechanism"] == "reweight" and runs.loc["grp-a0.5-s3", "backend"] == "local"
    assert runs.loc["grp-a0.5-s3", "wall_time_s"] == 12.5 and runs.loc["grp-a0.5-s3", "sweep"] == "grp"
    assert runs.loc["grp-a1-s1", "state"] == "failed" and not runs.loc["grp-a1-s1", "included"]
    long = data.metrics
    first = long[long["run"] == "grp-a0.5-s3"]
    accuracy = first[first["metric"] == "val/accuracy"]
    assert accuracy["step"].tolist() == [0, 2] and accuracy["value"].tolist() == [0.2, 0.4]
    assert set(long["metric"].astype(str)) == {"val/accuracy", "critic/score/mean"}  # _runtime and text dropped
    assert "grp-a1-s1" not in set(long["run"].astype(str))
    assert len(data.histograms) == 2 and data.histograms.iloc[0]["counts"].tolist() == [3.0, 1.0]

    def no_network() -> None:
        raise AssertionError("the second load must come from the cache")

    monkeypatch.setattr(wandb, "Api", no_network)
    cached = wandb_runs.load_wandb("team", "proj", group="grp", cache_dir=tmp_path / "cache")
    assert "cache" in cached.source
    pd.testing.assert_frame_equal(cached.metrics, data.metrics)
    assert cached.runs["run"].tolist() == data.runs["run"].tolist()
    assert cached.histograms.iloc[0]["edges"].tolist() == [0.0, 0.5, 1.0]

    monkeypatch.setattr(wandb, "Api", _FakeApi)
    wandb_runs.load_wandb("team", "proj", group="grp", cache_dir=tmp_path / "cache", refresh=True)
    assert len(_FakeApi.calls) == 2


def test_reads_what_the_project_run_store_writes(tmp_path: Path) -> None:
    from dataflex_rl.tracking.identity import RunIdentity
    from dataflex_rl.tracking.run_store import RunStore

    for seed, state in ((1, "completed"), (2, "failed")):
        run_dir = tmp_path / "sweep-x" / f"sweep-x-a0.5-s{seed}"
        store = RunStore(run_dir)
        config = {"seed": seed, "dataflex": {"mechanism": "reweight"}}
        store.write_config(config)
        store.write_meta(RunIdentity.for_config(config, sweep="sweep-x", run=run_dir.name, backend="local",
                                                mechanism="reweight", alpha=0.5, seed=seed))
        store.set_status("running", step=0)
        for step in range(3):
            store.log_metrics(step, {keys.SCORE_MEAN: 0.1 * step, **({keys.VAL_ACCURACY: 0.5} if step == 2 else {})})
        store.log_histogram(2, keys.HIST_WEIGHT, [0.0, 1.0, 2.0], [3, 1])
        if state == "failed":
            store.record_error("failed", "RuntimeError: boom")
        store.close(state)
    data = load.load_sweep(tmp_path / "sweep-x")
    runs = data.runs.set_index("run")
    assert runs.loc["sweep-x-a0.5-s1", "included"] and runs.loc["sweep-x-a0.5-s1", "metrics_source"] == "parquet"
    assert runs.loc["sweep-x-a0.5-s1", "alpha"] == 0.5 and runs.loc["sweep-x-a0.5-s1", "wall_time_s"] >= 0
    assert not runs.loc["sweep-x-a0.5-s2", "included"]
    assert runs.loc["sweep-x-a0.5-s2", "exclusion_reason"] == "state failed: RuntimeError: boom"
    score = data.metrics[data.metrics["metric"] == keys.SCORE_MEAN]
    assert score["step"].tolist() == [0, 1, 2] and score["value"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert data.metrics[data.metrics["metric"] == keys.VAL_ACCURACY]["step"].tolist() == [2]
    assert len(data.histograms) == 1 and data.histograms.loc[0, "counts"].tolist() == [3.0, 1.0]


def test_mechanism_label_from_meta_manifest_or_config(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    _two_metric_run(sweep / "from-meta", sweep="s", run="from-meta", mechanism_label="lopti", seed=1)
    _two_metric_run(sweep / "from-config", sweep="s", run="from-config", seed=2,
                    config={"mechanism_label": "ar", "seed": 2})
    _two_metric_run(sweep / "plain", sweep="s", run="plain", seed=3)
    (sweep / "sweep.json").write_text(json.dumps({"sweep": "s", "runs": [
        {"run": name, "mechanism_label": None, "state": "completed"} for name in ("from-meta", "from-config", "plain")]}))
    labels = load.load_sweep(sweep).runs.set_index("run")["mechanism_label"]
    assert labels.to_dict() == {"from-config": "ar", "from-meta": "lopti", "plain": "reweight"}


def _edit_run(run_dir: Path, file: str, change: dict[str, Any]) -> None:
    """A hand edit of a run's ``config.yaml`` (``change``: top-level sections updated) or ``meta.json``."""
    import yaml

    path = run_dir / file
    if file == "config.yaml":
        config = yaml.safe_load(path.read_text())
        for section, values in change.items():
            config[section] = {**config[section], **values}
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    else:
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


@pytest.mark.parametrize(("file", "change", "reason"), [
    ("config.yaml", {"trainer": {"lr": 0.5}}, "config.yaml is not the config the run recorded (its fingerprint is "),
    ("meta.json", {"alpha": 0.9, "seed": 2},
     "meta.json says alpha 0.9, config.yaml says 0.5; meta.json says seed 2, config.yaml says 1"),
])
def test_a_hand_edited_run_is_excluded_with_the_reason(complete_sweep: Path, file: str, change: dict[str, Any],
                                                       reason: str) -> None:
    """edit runs/<sweep>/<run>/config.yaml (trainer.lr) or meta.json (alpha 0.9, seed 2), then make report"""
    name = f"{complete_sweep.name}-a0.5-s1"
    _edit_run(complete_sweep / name, file, change)
    edited = (complete_sweep / name / file).read_bytes()
    data = load.load_sweep(complete_sweep)
    runs = data.runs.set_index("run")
    assert not runs.loc[name, "included"] and reason in runs.loc[name, "exclusion_reason"]
    assert runs["included"].sum() == 8 and name not in set(data.metrics["run"].astype(str))
    assert 0.9 not in set(data.metrics["alpha"])  # the edited identity never forms a group
    assert (complete_sweep / name / file).read_bytes() == edited


@pytest.mark.parametrize("target", ["other-run", "moved-away"])
def test_a_run_folder_that_is_a_link_is_listed_and_excluded(complete_sweep: Path, tmp_path: Path,
                                                            target: str) -> None:
    """ln -s <a run folder> runs/<sweep>/<run> (another run's, or the run itself moved away), then make report"""
    name = f"{complete_sweep.name}-a0.5-s1"
    link = complete_sweep / name
    if target == "moved-away":
        pointed = link.rename(tmp_path / "elsewhere")
    else:
        import shutil

        shutil.rmtree(link)
        pointed = complete_sweep / f"{complete_sweep.name}-a0-s1"
    link.symlink_to(pointed, target_is_directory=True)
    assert link in load.find_run_dirs(complete_sweep)
    data = load.load_sweep(complete_sweep)
    runs = data.runs.set_index("run")
    assert not runs.loc[name, "included"]
    assert f"the run folder is a symbolic link (to {pointed})" in runs.loc[name, "exclusion_reason"]
    assert runs.loc[name, "alpha"] == 0.5 and runs.loc[name, "seed"] == 1  # its sweep.json entry, not the target's
    assert runs["included"].sum() == 8 and link.is_symlink() and (pointed / "meta.json").is_file()
