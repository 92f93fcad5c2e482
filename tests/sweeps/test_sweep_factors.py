"""Every swept key is a factor end to end: the grid's axes reach meta.json, the W&B names, the loader's columns,
the default grouping, the seed-paired deltas (within each combination of the other factors) and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import aggregate, frames, load, plots
from analysis.report import main as report_main
from tests.analysis.synthetic import write_fake_run
from sweeps.cli import main

from .conftest import SCRIPTED_TRAIN


def test_alpha_by_lr_sweep_records_axes_and_reports_deltas_per_lr(tmp_path, repo_on_path):
    """The scripted trainer: val/accuracy = alpha + 0.01 * seed + 100 * lr, so every delta is exactly 0.5."""
    code = main(["alpha=0.0,0.5", "seeds=1,2", "steps=2", f"root={tmp_path / 'runs'}", "name=two",
                 f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=true", "poll_s=0.1",
                 "extra=[trainer.lr=1e-4,3e-4]"])
    assert code == 0
    sweep_dir = tmp_path / "runs" / "two"
    meta = json.loads((sweep_dir / "a0.5-s2-lr0.0003" / "meta.json").read_text())
    assert meta["axes"] == {"alpha": 0.5, "trainer.lr": 3e-4, "seed": 2}

    data = load.load_sweep(sweep_dir)
    assert frames.factor_columns(data.runs) == ["trainer.lr"]
    assert aggregate.default_group_keys(data.included_runs) == ("alpha", "trainer.lr")
    summaries = aggregate.run_summaries(data.metrics, metrics=["val/accuracy"])
    keys = aggregate.default_group_keys(data.included_runs)
    baseline = aggregate.default_baseline(summaries, keys)
    assert baseline == {"alpha": 0.0}
    deltas = aggregate.paired_differences(summaries, group_keys=keys, baseline=baseline, n_bootstrap=50)
    assert deltas[["alpha", "trainer.lr"]].to_numpy().tolist() == [[0.5, 1e-4], [0.5, 3e-4]]
    np.testing.assert_allclose(deltas["mean_difference"], [0.5, 0.5])
    np.testing.assert_allclose(deltas["baseline_mean"], [0.015 + 0.01, 0.015 + 0.03])
    assert deltas["n_pairs"].tolist() == [2, 2]

    report = (sweep_dir / "report" / "report.md").read_text()
    assert "Groups: alpha, trainer.lr." in report and "Baseline: alpha=0, at the same trainer.lr." in report
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.replace(" ", "").startswith("|alpha|trainer.lr|"))
    rows = [line.split("|")[1:5] for line in lines[header + 2:header + 6]]
    cells = [[cell.strip() for cell in row] for row in rows]
    assert [row[:2] for row in cells] == [["0", "0.0001"], ["0", "0.0003"], ["0.5", "0.0001"], ["0.5", "0.0003"]]
    assert [row[3].split(" ")[0] for row in cells] == ["baseline", "baseline", "+0.500", "+0.500"]
    assert not lines[header + 6].startswith("|")  # four rows, one per (alpha, lr)
    exported = __import__("pandas").read_parquet(sweep_dir / "metrics.parquet")
    assert sorted(exported["trainer.lr"].unique()) == [1e-4, 3e-4]


def _lopti_store(sweep_dir, label, eta, seed, accuracy):
    axes = {"mechanism_label": label, **({"eta": eta} if eta is not None else {}), "seed": seed}
    name = f"s{seed}-{label}" + (f"-eta{eta}" if eta is not None else "")
    histogram = {"step": 0, "name": "dataflex/hist/weight", "edges": [0.0, 1.0, 2.0], "counts": [seed, 1]}
    write_fake_run(sweep_dir / name, sweep="mech", run=name, alpha=0.0, seed=seed, mechanism_label=label,
                   metrics={"val/accuracy": [accuracy]}, axes=axes, histograms=[histogram])


def test_mech_by_eta_groups_each_eta_against_the_baseline_preset(tmp_path):
    sweep_dir = tmp_path / "mech"
    for seed in (1, 2, 3):
        _lopti_store(sweep_dir, "baseline", None, seed, 0.5 + 0.01 * seed)
        for eta in (0.3, 0.5):
            _lopti_store(sweep_dir, "lopti", eta, seed, 0.5 + 0.01 * seed + eta / 10 + 0.001 * seed * seed)
    data = load.load_sweep(sweep_dir)
    assert frames.factor_columns(data.runs) == ["eta"]
    assert np.isnan(data.runs.loc[data.runs["mechanism_label"] == "baseline", "eta"]).all()
    keys = aggregate.default_group_keys(data.included_runs)
    assert keys == ("mechanism_label", "alpha", "eta")
    summaries = aggregate.run_summaries(data.metrics)
    baseline = aggregate.default_baseline(summaries, keys)
    assert baseline["mechanism_label"] == "baseline" and np.isnan(baseline["eta"])
    deltas = aggregate.paired_differences(summaries, group_keys=keys, baseline=baseline, n_bootstrap=50)
    assert deltas["eta"].tolist() == [0.3, 0.5] and deltas["n_pairs"].tolist() == [3, 3]
    # paired differences eta/10 + 0.001 * seed^2 over seeds 1..3: mean eta/10 + 0.001 * 14/3
    np.testing.assert_allclose(deltas["mean_difference"], [0.03 + 0.014 / 3, 0.05 + 0.014 / 3])
    table = aggregate.aggregate_runs(summaries, group_keys=keys, n_bootstrap=50)
    assert len(table) == 3 and table["n"].tolist() == [3, 3, 3]
    # the histogram table carries the factors too, so figures group by them (the notebook's heatmaps)
    assert len(data.histograms[list(keys)].drop_duplicates()) == 3
    ax = plots.plot_histogram_heatmaps(data.histograms, "dataflex/hist/weight", group_keys=keys)
    assert ax is not None


def test_a_store_without_axes_loads_and_reports(tmp_path):
    """Runs outside a grid record no axes: alpha and seed are the only factors."""
    sweep_dir = tmp_path / "no_axes"
    for alpha in (0.0, 0.5):
        for seed in (1, 2):
            write_fake_run(sweep_dir / f"a{alpha}-s{seed}", sweep="no_axes", run=f"a{alpha}-s{seed}", alpha=alpha,
                           seed=seed, metrics={"val/accuracy": [alpha + 0.01 * seed]})
    assert "axes" not in json.loads((sweep_dir / "a0.5-s1" / "meta.json").read_text())
    data = load.load_sweep(sweep_dir)
    assert frames.factor_columns(data.runs) == [] and list(data.metrics.columns) == list(frames.LONG_COLUMNS)
    assert aggregate.default_group_keys(data.included_runs) == ("alpha",)
    assert report_main([str(sweep_dir), "--out", str(tmp_path / "report")]) == 0
    assert "Baseline: alpha=0." in (tmp_path / "report" / "report.md").read_text()


def test_deltas_pair_within_the_other_factors_only_where_the_baseline_varies():
    import pandas as pd

    summaries = pd.DataFrame({"alpha": [0.0, 0.5, 0.5], "lr": [1.0, 1.0, 2.0], "seed": [1, 1, 1],
                              "metric": "m", "final_window": [0.1, 0.4, 0.9]})
    deltas = aggregate.paired_differences(summaries, group_keys=("alpha", "lr"), baseline={"alpha": 0.0},
                                          n_bootstrap=10)
    # one baseline (lr 1): lr is not a stratum, so both alpha=0.5 groups compare with it
    assert deltas["mean_difference"].tolist() == pytest.approx([0.3, 0.8])
    two = pd.concat([summaries, summaries.iloc[[0]].assign(lr=2.0, final_window=0.2),
                     summaries.iloc[[0]].assign(lr=3.0, final_window=0.0)])
    deltas = aggregate.paired_differences(two, group_keys=("alpha", "lr"), baseline={"alpha": 0.0}, n_bootstrap=10)
    assert deltas["mean_difference"].tolist() == pytest.approx([0.3, 0.7])


@pytest.mark.slow
def test_real_alpha_by_lr_sweep_reports_four_rows_and_names_wandb_runs_after_the_axes(tmp_path, sft_cache):
    """A real 2 x 2 sweep (alpha x trainer.lr, one seed, 2 steps), W&B offline: the report has one row per
    (alpha, lr) with deltas against alpha = 0 at the same lr, and each offline W&B run carries its job type."""
    from dataflex_rl.tracking.wandb_file import read_run, run_files

    from .conftest import tiny_extra

    extra = tiny_extra(sft_cache).replace("logger.wandb.mode=disabled", "logger.wandb.mode=offline")
    extra = extra[:-1] + " trainer.lr=1e-4,3e-4]"
    assert main(["alpha=0.0,0.5", "seeds=1", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=real",
                 extra]) == 0
    sweep_dir = tmp_path / "runs" / "real"
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "Groups: alpha, trainer.lr." in report and "Baseline: alpha=0, at the same trainer.lr." in report
    data = load.load_sweep(sweep_dir)
    assert sorted(zip(data.runs["alpha"], data.runs["trainer.lr"])) == [(0.0, 1e-4), (0.0, 3e-4), (0.5, 1e-4),
                                                                        (0.5, 3e-4)]
    summaries = aggregate.run_summaries(data.metrics, metrics=["val/accuracy"])
    deltas = aggregate.paired_differences(summaries, group_keys=("alpha", "trainer.lr"), baseline={"alpha": 0.0},
                                          n_bootstrap=20)
    assert deltas["trainer.lr"].tolist() == [1e-4, 3e-4] and deltas["n_pairs"].tolist() == [1, 1]
    by_lr = summaries.set_index(["alpha", "trainer.lr"])["final_window"]
    np.testing.assert_allclose(deltas["mean_difference"],
                               [by_lr[(0.5, lr)] - by_lr[(0.0, lr)] for lr in (1e-4, 3e-4)])
    offline = {run.name: run for run in map(read_run, run_files(sweep_dir))}
    assert sorted(offline) == sorted(data.runs["run"])
    assert offline["a0.5-s1-lr0.0003"].job_type == "a0.5-lr0.0003"
    assert {run.group for run in offline.values()} == {"real"}


def test_an_axis_on_a_key_no_sweep_or_analysis_code_names_reaches_folders_job_types_and_the_report(tmp_path,
                                                                                                 repo_on_path):
    """``trainer.weight_decay`` appears nowhere in sweeps/ or analysis/: made an axis, it names the run folders,
    reaches meta.json's axes and the W&B job type built from them, and groups the report."""
    from dataflex_rl.tracking.identity import RunIdentity
    from dataflex_rl.tracking.run_store import read_meta

    from .conftest import REPO

    assert not [path for folder in ("sweeps", "analysis") for path in (REPO / folder).rglob("*.py")
                if "weight_decay" in path.read_text()]
    code = main(["alpha=0.0,0.5", "seeds=1,2", "steps=2", f"root={tmp_path / 'runs'}", "name=wd",
                 f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=true", "poll_s=0.1",
                 "extra=[trainer.weight_decay=0.0,0.1]"])
    assert code == 0
    sweep_dir = tmp_path / "runs" / "wd"
    runs = sorted(path.name for path in sweep_dir.iterdir() if (path / "meta.json").is_file())
    assert runs == [f"a{alpha}-s{seed}-weight_decay{decay}" for alpha in ("0.0", "0.5") for seed in (1, 2)
                    for decay in ("0.0", "0.1")]
    meta = read_meta(sweep_dir / "a0.5-s2-weight_decay0.1")
    assert meta["axes"] == {"alpha": 0.5, "trainer.weight_decay": 0.1, "seed": 2}
    fields = {field: meta[field] for field in ("sweep", "run", "backend", "mechanism", "alpha", "seed", "config_hash",
                                               "axes")}
    assert RunIdentity(**fields).job_type == "a0.5-weight_decay0.1"
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "Groups: alpha, trainer.weight_decay." in report
    assert "Baseline: alpha=0, at the same trainer.weight_decay." in report
    data = load.load_sweep(sweep_dir)
    assert sorted(set(zip(data.runs["alpha"], data.runs["trainer.weight_decay"]))) == [
        (0.0, 0.0), (0.0, 0.1), (0.5, 0.0), (0.5, 0.1)]
