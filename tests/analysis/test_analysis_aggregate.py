"""Aggregates against hand-computed values: IQM, final window, AUC, thresholds, curves, bootstrap, paired deltas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis import aggregate, bootstrap, frames, load, statistics
from analysis.curves import aggregate_curves, align_curves
from analysis.frames import RunMetrics
from tests.analysis.synthetic import write_fake_run


def _long(runs: list[dict]) -> pd.DataFrame:
    """Long table from ``[{"run", "alpha", "seed", "metrics": {key: (steps, values)}}]`` (via the real builder)."""
    run_rows, run_metrics = [], {}
    for position, run in enumerate(runs):
        run_rows.append({"sweep": "s", "run": run["run"], "backend": "local", "mechanism": "reweight",
                         "mechanism_label": run.get("label", "reweight"), "alpha": run["alpha"], "seed": run["seed"],
                         "included": True})
        all_steps = sorted({s for steps, _ in run["metrics"].values() for s in steps})
        values = np.full((len(run["metrics"]), len(all_steps)), np.nan)
        for row, (steps, metric_values) in enumerate(run["metrics"].values()):
            values[row, [all_steps.index(s) for s in steps]] = metric_values
        run_metrics[position] = RunMetrics(np.array(all_steps, np.int64), tuple(run["metrics"]), values)
    return frames.build_long_table(frames.make_run_table(run_rows), run_metrics)


# --- one-sample statistics ---------------------------------------------------------------------------------------


def test_interquartile_mean_by_hand() -> None:
    # n = 8: int(0.25 * 8) = 2 values cut at each end -> mean(3, 4, 5, 6) = 4.5 (the outlier 100 is gone)
    assert statistics.interquartile_mean([1, 2, 3, 4, 5, 6, 7, 100]) == pytest.approx(4.5)
    # n = 5: int(1.25) = 1 cut at each end -> mean(2, 3, 4) = 3
    assert statistics.interquartile_mean([100, 1, 3, 2, 4]) == pytest.approx(3.0)
    # n = 3: int(0.75) = 0 -> plain mean
    assert statistics.interquartile_mean([1, 2, 9]) == pytest.approx(4.0)


def test_rowwise_iqm_matches_scipy_with_missing_values() -> None:
    rng = np.random.default_rng(0)
    block = rng.normal(size=(6, 9))
    block[0, :4] = np.nan
    block[3, 1] = np.nan
    expected = [stats.trim_mean(row[np.isfinite(row)], 0.25) for row in block]
    np.testing.assert_allclose(statistics.rowwise_iqm(block), expected)


def test_probability_of_improvement_by_hand() -> None:
    # pairs (x_i, y_j): 1 loses twice; 2 ties twice (0.5 each); 3 wins twice -> (0 + 1 + 2) / 6
    assert statistics.probability_of_improvement([1, 2, 3], [2, 2]) == pytest.approx(0.5)
    assert statistics.probability_of_improvement([3, 4], [1, 2]) == 1.0
    assert statistics.probability_of_improvement([1], [1]) == 0.5
    with pytest.raises(ValueError, match="non-empty"):
        statistics.probability_of_improvement([], [1])


def test_bootstrap_is_deterministic_contains_mean_and_shrinks_with_n() -> None:
    sample = np.random.default_rng(1).normal(0.5, 0.1, size=1000)
    first = bootstrap.bootstrap_ci(sample[:10], random_state=7)
    assert first == bootstrap.bootstrap_ci(sample[:10], random_state=7)
    assert first != bootstrap.bootstrap_ci(sample[:10], random_state=8)
    for n in (10, 100, 1000):
        low, high = bootstrap.bootstrap_ci(sample[:n], random_state=0)
        assert low <= sample[:n].mean() <= high
    widths = [np.subtract(*bootstrap.bootstrap_ci(sample[:n], random_state=0)[::-1]) for n in (10, 100, 1000)]
    assert widths[0] > widths[1] > widths[2] > 0


def test_stratified_bootstrap_keeps_stratum_sizes() -> None:
    # Strata all-0 and all-1 of two values each: every stratified resample has two 0s and two 1s -> mean 0.5 always;
    # an unstratified bootstrap of the same four values does vary.
    stratified = bootstrap.stratified_bootstrap([[0.0, 0.0], [1.0, 1.0]], n_bootstrap=500, random_state=0)
    np.testing.assert_array_equal(stratified, 0.5)
    plain = bootstrap.stratified_bootstrap([0.0, 0.0, 1.0, 1.0], n_bootstrap=500, random_state=0)
    assert plain.std() > 0.1
    with pytest.raises(ValueError, match="confidence"):
        bootstrap.bootstrap_ci([1.0, 2.0], confidence=95)


# --- per-run summaries -------------------------------------------------------------------------------------------


def test_run_summaries_by_hand() -> None:
    long = _long([
        {"run": "r1", "alpha": 0.0, "seed": 1, "metrics": {
            "val/accuracy": ([0, 10, 20, 40], [0.0, 1.0, 1.0, 3.0]),
            "timing_s/step": ([0, 10, 20, 40], [5.0, 2.0, 4.0, 3.0]),
            "single": ([30], [0.7]),
        }},
    ])
    summary = aggregate.run_summaries(long, final_window=2, thresholds={"val/accuracy": 1.0, "timing_s/step": 2.5})
    rows = summary.set_index(summary["metric"].astype(str))
    accuracy = rows.loc["val/accuracy"]
    assert accuracy["n_points"] == 4 and accuracy["first_step"] == 0 and accuracy["last_step"] == 40
    assert accuracy["final"] == 3.0
    assert accuracy["final_window"] == pytest.approx((1.0 + 3.0) / 2)
    # trapezoids: (0+1)/2*10 + (1+1)/2*10 + (1+3)/2*20 = 5 + 10 + 40 = 55, over a span of 40 steps
    assert accuracy["auc"] == pytest.approx(55.0 / 40.0)
    assert accuracy["best"] == 3.0 and accuracy["steps_to_threshold"] == 10
    timing = rows.loc["timing_s/step"]  # lower is better: best is the minimum, threshold means "<= 2.5"
    assert timing["best"] == 2.0 and timing["steps_to_threshold"] == 10
    single = rows.loc["single"]
    assert single["auc"] == 0.7 and single["final_window"] == 0.7 and np.isnan(single["steps_to_threshold"])


def test_run_summaries_do_not_depend_on_row_order() -> None:
    long = _long([
        {"run": f"r{i}", "alpha": 0.5, "seed": i, "metrics": {"m": ([0, 1, 2, 5], [i, i + 1.0, 2.0, 0.5 * i])}}
        for i in range(4)
    ])
    ordered = aggregate.run_summaries(long)
    shuffled = aggregate.run_summaries(long.sample(frac=1.0, random_state=3))
    pd.testing.assert_frame_equal(ordered, shuffled)


def test_run_summaries_unknown_metric_names_the_key() -> None:
    long = _long([{"run": "r", "alpha": 0.0, "seed": 1, "metrics": {"m": ([0], [1.0])}}])
    with pytest.raises(KeyError, match="nope"):
        aggregate.run_summaries(long, metrics=["nope"])


# --- curves ------------------------------------------------------------------------------------------------------


def test_unequal_length_curves_forward_fill_and_never_extrapolate() -> None:
    long = _long([
        {"run": "long", "alpha": 0.0, "seed": 1, "metrics": {"m": ([0, 2, 4, 6], [1.0, 2.0, 3.0, 4.0])}},
        {"run": "short", "alpha": 0.0, "seed": 2, "metrics": {"m": ([0, 1, 2], [10.0, 20.0, 30.0])}},
        {"run": "late", "alpha": 0.0, "seed": 3, "metrics": {"m": ([2, 4], [7.0, 9.0])}},
    ])
    aligned = align_curves(long, "m")
    assert aligned.index.tolist() == [0, 1, 2, 4, 6]
    by_run = {name: aligned.xs(name, axis=1, level="run").iloc[:, 0].tolist() for name in ("long", "short", "late")}
    assert by_run["long"] == [1.0, 1.0, 2.0, 3.0, 4.0]  # step 1 forward-filled from step 0
    assert by_run["short"][:3] == [10.0, 20.0, 30.0] and np.isnan(by_run["short"][3:]).all()  # ends at step 2
    assert np.isnan(by_run["late"][:2]).all() and by_run["late"][2:4] == [7.0, 9.0] and np.isnan(by_run["late"][4])

    curves = aggregate_curves(long, "m").set_index("step")
    assert curves["n"].tolist() == [2, 2, 3, 2, 1]
    assert curves.loc[1, "mean"] == pytest.approx((1.0 + 20.0) / 2)
    assert curves.loc[2, "mean"] == pytest.approx((2.0 + 30.0 + 7.0) / 3)
    # one run covers step 6: a mean but no interval
    assert curves.loc[6, "mean"] == 4.0 and np.isnan(curves.loc[6, "ci_low"]) and np.isnan(curves.loc[6, "ci_high"])
    # step 2: values 2, 30, 7 -> mean 13, s = sqrt(((-11)^2 + 17^2 + (-6)^2) / 2) = sqrt(223), t_{0.975,2} = 4.302653
    half = 4.302653 * np.sqrt(223.0) / np.sqrt(3.0)
    assert curves.loc[2, "ci_low"] == pytest.approx(13.0 - half, rel=1e-6)
    assert curves.loc[2, "ci_high"] == pytest.approx(13.0 + half, rel=1e-6)
    assert curves.loc[2, "iqm"] == pytest.approx(stats.trim_mean([2.0, 30.0, 7.0], 0.25))

    explicit = align_curves(long, "m", step_grid=[0, 3, 5])
    assert explicit.xs("long", axis=1, level="run").iloc[:, 0].tolist() == [1.0, 2.0, 3.0]


def test_aggregate_curves_groups_and_is_deterministic(tmp_path: Path) -> None:
    for alpha in (0.0, 1.0):
        for seed in (1, 2):
            write_fake_run(tmp_path / "s" / f"a{alpha}-s{seed}", sweep="s", alpha=alpha, seed=seed,
                           metrics={"m": np.arange(5.0) * (1 + alpha) + seed})
    long = load.load_sweep(tmp_path / "s").metrics
    first = aggregate_curves(long, "m")
    pd.testing.assert_frame_equal(first, aggregate_curves(long, "m"))
    assert sorted(first["alpha"].unique()) == [0.0, 1.0] and len(first) == 10
    # alpha = 1, step 4: seeds give 8 + 1 and 8 + 2
    assert first.set_index(["alpha", "step"]).loc[(1.0, 4), "mean"] == pytest.approx(9.5)
    with pytest.raises(KeyError, match="available"):
        aggregate_curves(long, "missing")


# --- groups and paired differences -------------------------------------------------------------------------------


def _summaries(rows: list[tuple[float, int, float]], metric: str = "val/accuracy") -> pd.DataFrame:
    return pd.DataFrame({"sweep": "s", "run": [f"a{a}-s{s}" for a, s, _ in rows], "alpha": [a for a, _, _ in rows],
                         "seed": [s for _, s, _ in rows], "metric": metric, "final_window": [v for _, _, v in rows],
                         "mechanism_label": "reweight"})


def test_aggregate_runs_by_hand() -> None:
    summaries = _summaries([(0.5, 1, 1.0), (0.5, 2, 2.0), (0.5, 3, 3.0), (0.5, 4, 4.0), (0.0, 1, 7.0),
                            (0.0, 2, np.nan)])
    result = aggregate.aggregate_runs(summaries, random_state=0).set_index("alpha")
    row = result.loc[0.5]
    assert row["n"] == 4 and row["mean"] == pytest.approx(2.5)
    assert row["std"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert row["iqm"] == pytest.approx(2.5)  # int(0.25*4)=1 cut each end -> mean(2, 3)
    # Student t: s = sqrt(5/3) = 1.290994, t_{0.975,3} = 3.182446 -> half-width 3.182446 * 1.290994 / 2 = 2.054260
    assert row["ci_low"] == pytest.approx(0.445740, abs=1e-6) and row["ci_high"] == pytest.approx(4.554260, abs=1e-6)
    assert np.isnan(row["iqm_ci_low"]) and np.isnan(row["iqm_ci_high"])  # 4 runs: below MIN_BOOTSTRAP_N, refused
    single = result.loc[0.0]  # the NaN run is ignored: one value, no interval
    assert single["n"] == 1 and single["mean"] == 7.0 and np.isnan(single["ci_low"]) and np.isnan(single["ci_high"])
    assert np.isnan(single["std"])
    pd.testing.assert_frame_equal(aggregate.aggregate_runs(summaries, random_state=0).set_index("alpha"), result)
    with pytest.raises(KeyError, match="temperature"):
        aggregate.aggregate_runs(summaries, group_keys=("temperature",))


def test_paired_differences_by_hand() -> None:
    summaries = _summaries([(0.0, 1, 0.5), (0.0, 2, 0.6), (0.0, 3, 0.7),
                            (0.5, 1, 0.6), (0.5, 2, 0.9), (0.5, 4, 0.1)])
    result = aggregate.paired_differences(summaries, n_bootstrap=500, random_state=0)
    assert len(result) == 1
    row = result.iloc[0]
    # common seeds 1 and 2: differences 0.1 and 0.3
    assert row["alpha"] == 0.5 and row["n_pairs"] == 2
    assert row["mean_difference"] == pytest.approx(0.2)
    assert row["mean"] == pytest.approx(0.75) and row["baseline_mean"] == pytest.approx(0.55)
    # x = (0.6, 0.9), y = (0.5, 0.6): 0.6>0.5, 0.6=0.6 (half), 0.9>0.5, 0.9>0.6 -> 3.5 / 4
    assert row["prob_improvement"] == pytest.approx(0.875)
    # paired t: s_d = 0.141421, se = 0.1, t_{0.975,1} = 12.706205 -> 0.2 +- 1.270620
    assert row["ci_low"] == pytest.approx(-1.070620, abs=1e-6) and row["ci_high"] == pytest.approx(1.470620, abs=1e-6)
    # t = 2 on 1 df: p = 1 - 2 atan(2) / pi
    assert row["p_value"] == pytest.approx(1.0 - 2.0 * np.arctan(2.0) / np.pi)
    assert row["p_holm"] == pytest.approx(row["p_value"])  # a single comparison: Holm changes nothing
    assert row["method"] == "paired t" and row["std_difference"] == pytest.approx(np.sqrt(0.02))
    assert row["mde"] > 1.0  # two pairs detect almost nothing
    assert np.isnan(row["prob_ci_low"]) and np.isnan(row["prob_ci_high"])  # bootstrap refused at 2 pairs


def test_paired_differences_lower_is_better_and_errors() -> None:
    summaries = _summaries([(0.0, 1, 5.0), (0.0, 2, 5.0), (1.0, 1, 3.0), (1.0, 2, 4.0)], metric="timing_s/step")
    row = aggregate.paired_differences(summaries, random_state=0).iloc[0]
    assert row["mean_difference"] == pytest.approx(-1.5) and row["prob_improvement"] == 1.0  # faster is better
    with pytest.raises(ValueError, match="selects 0 groups"):
        aggregate.paired_differences(summaries, baseline={"alpha": 0.3})
    duplicated = pd.concat([summaries, summaries.iloc[[0]].assign(run="again")])
    with pytest.raises(ValueError, match="pair_on"):
        aggregate.paired_differences(duplicated)


def test_default_group_keys_and_baseline() -> None:
    plain = _summaries([(0.0, 1, 0.5), (1.0, 1, 0.6)])
    assert aggregate.default_group_keys(plain) == ("alpha",)
    assert aggregate.default_baseline(plain, ("alpha",)) == {"alpha": 0.0}
    labelled = plain.assign(mechanism_label=["baseline", "ar"])
    keys = aggregate.default_group_keys(labelled)
    assert keys == ("mechanism_label", "alpha")
    assert aggregate.default_baseline(labelled, keys) == {"mechanism_label": "baseline", "alpha": 0.0}
    ambiguous = pd.concat([plain.assign(mechanism_label="ar"), plain.assign(mechanism_label="lopti")])
    assert aggregate.default_baseline(ambiguous, ("mechanism_label", "alpha")) is None
    assert not aggregate.lower_is_better("val/accuracy") and aggregate.lower_is_better("timing_s/gen")
