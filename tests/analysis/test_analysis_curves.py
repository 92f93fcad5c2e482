"""Where in training two groups differ: per-step paired differences by hand, the simultaneous band's and the IQM
interval's coverage by simulation at 3, 5 and 10 seeds, the figures, and the report section."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats

import analysis
from analysis import curves, frames, load, plots, report_figures, statistics
from analysis.frames import RunMetrics
from tests.analysis.synthetic import simulate_band_coverage, simulate_curve_interval_coverage, write_fake_sweep
from dataflex_rl import keys

METRIC = "val/accuracy"


@pytest.fixture(autouse=True)
def close_figures() -> None:
    yield
    plt.close("all")


def _long(runs: list[tuple[float, int, dict[int, float]]]) -> pd.DataFrame:
    """Long table of ``METRIC`` from ``[(alpha, seed, {step: value})]``, through the loaders' own builder."""
    run_rows, run_metrics = [], {}
    for position, (alpha, seed, values) in enumerate(runs):
        run_rows.append({"sweep": "s", "run": f"a{alpha}-s{seed}", "backend": "local", "mechanism": "reweight",
                         "mechanism_label": "reweight", "alpha": alpha, "seed": seed, "included": True})
        steps = np.array(sorted(values), dtype=np.int64)
        run_metrics[position] = RunMetrics(steps, (METRIC,), np.array([[values[int(s)] for s in steps]]))
    return frames.build_long_table(frames.make_run_table(run_rows), run_metrics)


# Baseline (alpha 0) and treatment (alpha 0.5) on seeds 1-3. Paired differences, treatment minus baseline:
# step 0: (0.1, 0.2, 0.3); step 10: (0.0, 0.0, 0.3); step 20: seeds 1 and 2 only, (0.1, 0.3); step 30: seed 1 only,
# 0.05; step 40: the baseline alone.
HAND_TABLE = [
    (0.0, 1, {0: 0.50, 10: 0.60, 20: 0.70, 30: 0.75, 40: 0.80}),
    (0.0, 2, {0: 0.40, 10: 0.55, 20: 0.65, 40: 0.75}),
    (0.0, 3, {0: 0.45, 10: 0.50, 20: 0.60, 40: 0.70}),
    (0.5, 1, {0: 0.60, 10: 0.60, 20: 0.80, 30: 0.80}),
    (0.5, 2, {0: 0.60, 10: 0.55, 20: 0.95}),
    (0.5, 3, {0: 0.75, 10: 0.80}),
]


def test_curve_differences_by_hand() -> None:
    frame = curves.curve_differences(_long(HAND_TABLE), METRIC)  # default group keys (alpha) and baseline (alpha 0)
    assert list(frame.columns) == ["alpha", *curves.CURVE_DIFFERENCE_COLUMNS]
    assert frame["alpha"].tolist() == [0.5] * 4 and frame["step"].tolist() == [0, 10, 20, 30]
    assert frame["n"].tolist() == [3, 3, 2, 1]
    np.testing.assert_allclose(frame["mean_diff"], [0.2, 0.1, 0.2, 0.05], atol=1e-12)
    np.testing.assert_allclose(frame["mean"][:1], [(0.60 + 0.60 + 0.75) / 3])
    np.testing.assert_allclose(frame["baseline_mean"][:1], [(0.50 + 0.40 + 0.45) / 3])
    # standard errors: s = 0.1 / sqrt(3); s = sqrt(((-0.1)^2 + (-0.1)^2 + 0.2^2) / 2) = sqrt(0.03) / sqrt(3);
    # s = sqrt(0.02) / sqrt(2) = 0.1
    standard_error = np.array([0.1 / np.sqrt(3), np.sqrt(0.03) / np.sqrt(3), 0.1])
    degrees = np.array([2, 2, 1])
    pointwise = stats.t.ppf(0.975, degrees) * standard_error
    # K = 3 steps have an interval (30 has one pair): Bonferroni quantile t_{1 - 0.05 / 6, n - 1}
    band = stats.t.ppf(1.0 - 0.05 / 6.0, degrees) * standard_error
    np.testing.assert_allclose((frame["ci_high"] - frame["mean_diff"])[:3], pointwise, rtol=1e-9)
    np.testing.assert_allclose((frame["mean_diff"] - frame["ci_low"])[:3], pointwise, rtol=1e-9)
    np.testing.assert_allclose((frame["band_high"] - frame["mean_diff"])[:3], band, rtol=1e-9)
    np.testing.assert_allclose((frame["mean_diff"] - frame["band_low"])[:3], band, rtol=1e-9)
    assert pointwise[0] == pytest.approx(4.302653 * 0.1 / np.sqrt(3), rel=1e-6)  # t_{0.975, 2} = 4.302653
    assert (frame["band_steps"] == 3).all() and (frame["band_method"] == "bonferroni-t").all()
    assert (frame["confidence"] == 0.95).all()
    last = frame.iloc[3]  # one pair: the difference, no interval, and a note saying why
    assert np.isnan(last[["ci_low", "ci_high", "band_low", "band_high", "std_diff"]].astype(float)).all()
    assert last["note"] == curves.TOO_FEW_PAIRS_NOTE and (frame["note"][:3] == "").all()


def test_curve_differences_pair_within_strata_and_refuse_ambiguous_baselines() -> None:
    # alpha 0 at each learning rate is the baseline of that learning rate: differences 0.1 and 0.2 at lr 1e-4,
    # 0.3 and 0.4 at lr 3e-4 (against a baseline 0.2 higher, which a wrong pairing would show)
    rows = [(lr, alpha, seed, base + (difference if alpha else 0.0))
            for lr, base, differences in ((1e-4, 0.5, (0.1, 0.2)), (3e-4, 0.7, (0.3, 0.4)))
            for seed, difference in zip((1, 2), differences, strict=True) for alpha in (0.0, 0.5)]
    long = pd.DataFrame({"sweep": "s", "run": [f"lr{lr}-a{a}-s{s}" for lr, a, s, _ in rows], "metric": METRIC,
                         "lr": [r[0] for r in rows], "alpha": [r[1] for r in rows], "seed": [r[2] for r in rows],
                         "step": 10, "value": [r[3] for r in rows]})
    frame = curves.curve_differences(long, METRIC, group_keys=("alpha", "lr"), baseline={"alpha": 0.0})
    assert frame["lr"].tolist() == [1e-4, 3e-4] and frame["n"].tolist() == [2, 2]
    np.testing.assert_allclose(frame["mean_diff"], [0.15, 0.35])
    assert (frame["band_steps"] == 1).all()  # one step: the band is the pointwise interval
    np.testing.assert_allclose(frame["band_low"], frame["ci_low"])

    with pytest.raises(ValueError, match="no single baseline"):
        curves.curve_differences(long[long["alpha"] == 0.5], METRIC, group_keys=("alpha",))
    repeated = pd.concat([long, long.iloc[[0]].assign(run="again")])
    with pytest.raises(ValueError, match="pair_on"):
        curves.curve_differences(repeated, METRIC, group_keys=("alpha", "lr"), baseline={"alpha": 0.0})


# --- coverage by simulation --------------------------------------------------------------------------------------

REPLICATES = 2000
# 3 binomial standard errors of a 95% coverage measured on REPLICATES replicates. The pointwise coverage averages
# the K steps of each replicate: correlated steps make its variance at most that of one step, so this bounds it too.
TOLERANCE = 3.0 * np.sqrt(0.95 * 0.05 / REPLICATES)


@pytest.mark.parametrize("n_seeds", [3, 5, 10])
def test_band_covers_the_whole_curve_and_intervals_cover_each_step(n_seeds: int) -> None:
    result = simulate_band_coverage(n_seeds, n_replicates=REPLICATES, n_steps=8, autocorrelation=0.7,
                                    random_state=n_seeds)
    assert abs(result["pointwise"] - 0.95) <= TOLERANCE
    assert result["simultaneous"] >= 0.95 - TOLERANCE
    assert abs(result["simultaneous"] - curves.MEASURED_BAND_COVERAGE[n_seeds]) <= TOLERANCE  # what docs quote
    assert result["pointwise_simultaneous"] < 0.85  # why the band: pointwise intervals miss somewhere far more often
    # every step has n_seeds pairs, so the band is wider by the ratio of the two t quantiles, K = 8
    ratio = stats.t.ppf(1.0 - 0.05 / 16.0, n_seeds - 1) / stats.t.ppf(0.975, n_seeds - 1)
    assert result["band_width_ratio"] == pytest.approx(ratio, rel=1e-9)


# Tukey-McLaughlin coverage of a nominal 95% for normal data, measured on 100000 replicates (random_state 1): exact
# at n < 4, where it is the t interval; about a point low at 5 and 10 seeds.
IQM_COVERAGE = {3: 0.949, 5: 0.938, 10: 0.941}


@pytest.mark.parametrize("n_seeds", [3, 5, 10])
def test_curve_mean_and_iqm_intervals_cover(n_seeds: int) -> None:
    replicates = 4000
    tolerance = 3.0 * np.sqrt(0.95 * 0.05 / replicates)
    result = simulate_curve_interval_coverage(n_seeds, n_replicates=replicates, random_state=n_seeds)
    assert abs(result["mean"] - 0.95) <= tolerance
    assert abs(result["iqm"] - IQM_COVERAGE[n_seeds]) <= tolerance and result["iqm"] >= 0.92
    if n_seeds < 4:
        assert result["iqm"] == result["mean"]  # nothing trimmed: the same interval


def test_iqm_interval_by_hand_and_against_scipy() -> None:
    # n = 5: g = floor(1.25) = 1 cut at each end, h = 3 kept; IQM = mean(2, 3, 4) = 3; winsorised (2, 2, 3, 4, 4) has
    # mean 3 and SSW = 1 + 1 + 0 + 1 + 1 = 4; se = sqrt(4 / (3 * 2)); t_{0.975, 2} = 4.302653
    low, high = statistics.iqm_t_interval([1.0, 2.0, 3.0, 4.0, 10.0])
    half = 4.302653 * np.sqrt(4.0 / 6.0)
    assert low == pytest.approx(3.0 - half, rel=1e-6) and high == pytest.approx(3.0 + half, rel=1e-6)
    # Yuen's trimmed t of scipy against a constant sample: the same standard error and h - 1 degrees of freedom
    sample = np.random.default_rng(0).normal(size=8)
    expected = stats.ttest_ind(sample, np.zeros(4), trim=0.25, equal_var=False).confidence_interval(0.95)
    np.testing.assert_allclose(statistics.iqm_t_interval(sample), (expected.low, expected.high), rtol=1e-10)
    np.testing.assert_allclose(statistics.iqm_t_interval([1.0, 2.0, 9.0]), stats.ttest_1samp([1.0, 2.0, 9.0], 0.0).confidence_interval())
    assert np.isnan(statistics.iqm_t_interval([1.0])).all()


def test_aggregate_curves_iqm_interval_per_step() -> None:
    # five runs at step 0, three of them at step 1 (the other two end at step 0)
    values = {1: (0.1, 0.5), 2: (0.2, 0.6), 3: (0.3, 0.9), 4: (0.4, None), 5: (1.0, None)}
    long = _long([(0.0, seed, {step: v for step, v in enumerate(pair) if v is not None})
                  for seed, pair in values.items()])
    frame = curves.aggregate_curves(long, METRIC).set_index("step")
    np.testing.assert_allclose(frame.loc[0, ["iqm_ci_low", "iqm_ci_high"]].astype(float),
                               statistics.iqm_t_interval([0.1, 0.2, 0.3, 0.4, 1.0]))
    np.testing.assert_allclose(frame.loc[1, ["iqm_ci_low", "iqm_ci_high"]].astype(float),
                               stats.ttest_1samp([0.5, 0.6, 0.9], 0.0).confidence_interval())


# --- figures and the report ----------------------------------------------------------------------------------------


def test_plot_curve_difference_draws_both_bands_and_a_zero_line() -> None:
    frame = curves.curve_differences(_long(HAND_TABLE), METRIC)
    _, ax = plt.subplots()
    assert plots.plot_curve_difference(frame, ax=ax) is ax
    band, pointwise = ax.collections[0], ax.collections[1]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), frame["mean_diff"])
    assert np.nanmax(band.get_paths()[0].vertices[:, 1]) == pytest.approx(np.nanmax(frame["band_high"]))
    assert np.nanmax(pointwise.get_paths()[0].vertices[:, 1]) == pytest.approx(np.nanmax(frame["ci_high"]))
    assert band.get_alpha() < pointwise.get_alpha()  # the simultaneous band is the light one
    assert any(np.allclose(line.get_ydata(), 0.0) for line in ax.lines[1:])
    assert "bonferroni-t, 3 steps" in ax.get_legend().get_texts()[0].get_text()
    two = pd.concat([frame, frame.assign(alpha=1.0)])
    with pytest.raises(ValueError, match="one comparison"):
        plots.plot_curve_difference(two)


def test_plot_sample_efficiency_mean_and_iqm_panels(tmp_path: Path) -> None:
    data = load.load_sweep(write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2, 3, 4, 5), n_steps=12,
                                            histograms=False, grad_stats=False, write_manifest=False))
    # alpha 0.5 keeps two seeds: it gets its line but no band (bands from MIN_SEEDS_FOR_INTERVAL = 3 seeds)
    metrics = data.metrics[(data.metrics["alpha"] == 0.0) | (data.metrics["seed"] <= 2)]
    axes = plots.plot_sample_efficiency(metrics, keys.VAL_ACCURACY)
    assert axes.shape == (2,) and all(len(ax.lines) == 2 for ax in axes)
    expected = curves.aggregate_curves(metrics, keys.VAL_ACCURACY)
    baseline = expected[expected["alpha"] == 0.0]
    np.testing.assert_allclose(axes[0].lines[0].get_ydata(), baseline["mean"])
    np.testing.assert_allclose(axes[1].lines[0].get_ydata(), baseline["iqm"])
    assert "Tukey-McLaughlin" in axes[1].get_title()
    assert len(axes[1].collections[0].get_paths()) > 0 and len(axes[1].collections[1].get_paths()) == 0


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The report's figures by file stem, drawn but not written (PNG and PDF output is tested with the report)."""
    saved: dict[str, object] = {}

    def record(figure, stem):
        saved[Path(stem).name] = figure
        return [Path(f"{stem}.png"), Path(f"{stem}.pdf")]

    monkeypatch.setattr(report_figures.plots, "save_figure", record)
    return saved


def _section(data: frames.SweepData, out_dir: Path, metrics=(keys.VAL_ACCURACY,)) -> str:
    document = report_figures.Document(out_dir)
    report_figures.where_groups_differ_section(document, data, list(metrics), ("alpha",),
                                               report_figures.ReportOptions())
    return "\n".join(document.lines)


def test_report_section_draws_each_comparison_and_the_sample_efficiency(tmp_path: Path, saved_figures,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = load.load_sweep(write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2, 3), n_steps=12,
                                            histograms=False, grad_stats=False, write_manifest=False))
    # the reward is logged at all 12 steps, validation accuracy at 4: with a threshold of 10 points per run the reward
    # counts as a per-step training metric and is not compared step by step
    monkeypatch.setattr(report_figures, "SMOOTH_MIN_POINTS", 10)
    text = _section(data, tmp_path, metrics=(keys.VAL_ACCURACY, keys.SCORE_MEAN))
    assert text.startswith("## Where in training the groups differ")
    assert "Not compared step by step (logged at least 10 times per run" in text and "): critic/score/mean." in text
    assert "bonferroni-t" in text and "95.3%, 95.2%, 95.4% at 3, 5, 10 seeds" in text
    assert "### val/accuracy: alpha=0.5 against the baseline" in text and "### Sample efficiency" in text
    assert sorted(saved_figures) == ["fig_difference_val_accuracy_alpha_0_5", "fig_sample_efficiency_val_accuracy"]
    difference_axes = saved_figures["fig_difference_val_accuracy_alpha_0_5"].axes
    expected = curves.curve_differences(data.metrics, keys.VAL_ACCURACY, group_keys=("alpha",))
    assert len(difference_axes) == 1
    np.testing.assert_allclose(difference_axes[0].lines[0].get_ydata(), expected["mean_diff"])
    assert len(saved_figures["fig_sample_efficiency_val_accuracy"].axes) == 2


def test_report_section_with_too_few_seeds_or_no_baseline(tmp_path: Path, saved_figures) -> None:
    data = load.load_sweep(write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=12,
                                            histograms=False, grad_stats=False, write_manifest=False))
    text = _section(data, tmp_path)
    assert "not drawn (fewer than 3 seeds paired with the baseline" in text and "alpha=0.5 (2)" in text
    assert "Skipped: fewer than two groups with 3 seeds." in text and not saved_figures
    without_baseline = frames.SweepData(runs=data.runs.assign(alpha=data.runs["alpha"] + 1.0),
                                      metrics=data.metrics.assign(alpha=data.metrics["alpha"] + 1.0),
                                      histograms=data.histograms)
    assert _section(without_baseline, tmp_path) == ""  # no alpha = 0: silently nothing


def test_new_functions_are_reachable_from_the_package() -> None:
    assert analysis.curve_differences is curves.curve_differences
    assert analysis.plot_curve_difference is plots.plot_curve_difference
    assert analysis.iqm_t_interval is statistics.iqm_t_interval
    with pytest.raises(AttributeError, match="no attribute"):
        _ = analysis.not_a_function
