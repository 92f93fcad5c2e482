"""Figure styling on fake sweeps: logged bin edges and cropping, log count axis, EMA, palette contrast, PDF output,
identical series drawn once."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import QuadMesh

from analysis import frames, load, plots
from analysis.report import build_report
from tests.analysis.synthetic import write_fake_run, write_fake_sweep
from dataflex_rl import keys

WEIGHT_EDGES = np.linspace(0.0, 4.0, 81)  # the trainer's fixed edges: 80 bins of 0.05


@pytest.fixture(autouse=True)
def close_figures() -> None:
    yield
    plt.close("all")


def weight_histograms(alpha: float, steps=(0, 10)) -> list[dict]:
    """alpha = 0: every weight exactly 1.0 (bin [1.0, 1.05)); alpha > 0: weights spread over [0.5, 1.2)."""
    records = []
    for step in steps:
        counts = np.zeros(80)
        if alpha == 0:
            counts[20] = 1000
        else:
            counts[10:24] = 50
        records.append({"step": step, "name": keys.HIST_WEIGHT, "edges": WEIGHT_EDGES, "counts": counts})
        probabilities = np.zeros(50)
        probabilities[-1], probabilities[0] = 990, 10  # a spike at 1 and a small low-probability tail
        records.append({"step": step, "name": keys.HIST_TOKEN_PROB, "edges": np.linspace(0, 1, 51),
                        "counts": probabilities})
    return records


@pytest.fixture
def histogram_sweep(tmp_path: Path) -> frames.SweepData:
    for alpha in (0.0, 0.5):
        write_fake_run(tmp_path / "sweep" / f"a{alpha}", metrics={keys.SCORE_MEAN: [0.1, 0.2]}, steps=[0, 10],
                       sweep="sweep", run=f"a{alpha}", alpha=alpha, seed=1, histograms=weight_histograms(alpha))
    return load.load_sweep(tmp_path / "sweep")


def test_heatmap_keeps_the_logged_bin_edges_and_crops_to_the_data(histogram_sweep):
    axes = plots.plot_histogram_heatmaps(histogram_sweep.histograms, keys.HIST_WEIGHT)
    baseline_mesh = next(c for c in axes[0].collections if isinstance(c, QuadMesh))
    values = baseline_mesh.get_array().reshape(80, 2)  # 80 logged bins x 2 steps: no rebinning
    occupied = np.flatnonzero(values.sum(axis=1))
    assert occupied.tolist() == [20]  # alpha = 0's weights of exactly 1.0 are one band, [1.0, 1.05)
    np.testing.assert_allclose(values[20], 1.0)
    # the y-axis spans the bins any group occupies ([0.5, 1.2)), one empty bin either side
    for ax in axes:
        assert ax.get_ylim() == pytest.approx((0.45, 1.25))


def test_heatmap_without_shared_edges_rebins_to_equal_bins(histogram_sweep):
    histograms = histogram_sweep.histograms.copy()
    first = histograms.index[histograms["name"] == keys.HIST_WEIGHT][0]
    histograms.at[first, "edges"] = np.linspace(0.0, 4.0, 41)
    histograms.at[first, "counts"] = np.asarray(histograms.at[first, "counts"]).reshape(40, 2).sum(axis=1)
    steps, edges, fractions = plots.histogram_matrix(histograms, keys.HIST_WEIGHT)
    assert edges.size == 51 and np.allclose(fractions.sum(axis=1), 1.0)  # 50 equal bins over [0, 4]


def test_token_probability_histogram_has_a_log_count_axis_and_one_overlay_per_alpha(histogram_sweep):
    ax = plots.plot_histogram(histogram_sweep.histograms, keys.HIST_TOKEN_PROB)
    assert ax.get_yscale() == "log"
    assert len(ax.patches) == 2
    np.testing.assert_allclose(ax.patches[0].get_data().edges, np.linspace(0, 1, 51))
    assert ax.patches[0].get_data().values[0] == 10  # the tail is counted in tokens per run, not hidden
    assert "step 10" in ax.get_title() and "\u03c0" in ax.get_xlabel()


def test_ema_by_hand():
    # smoothing 0.5: s = 0.5, 0.5*0.5 + 0.5*1 = 0.75 ... debiased by 1 - 0.5^(t+1): 1, 0.75/0.75 = 1 for a constant
    np.testing.assert_allclose(plots.ema(np.array([1.0, 1.0, 1.0]), 0.5), [1.0, 1.0, 1.0])
    # x = (0, 2): s_1 = 0.5*0 + 0.5*2 = 1.0 (raw state 0, then 1.0), weight 0.75 -> 1/0.75
    np.testing.assert_allclose(plots.ema(np.array([0.0, 2.0]), 0.5), [0.0, 1.0 / 0.75])
    np.testing.assert_allclose(plots.ema(np.array([np.nan, 4.0, np.nan]), 0.9), [np.nan, 4.0, 4.0])
    with pytest.raises(ValueError, match="smoothing"):
        plots.ema(np.ones(3), 1.0)


def test_smoothed_curves_keep_the_raw_mean_faint_behind(tmp_path):
    data = load.load_sweep(write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=20,
                                            histograms=False, grad_stats=False))
    ax = plots.plot_curves(data.metrics, keys.SCORE_MEAN, smoothing=0.8)
    raw, smoothed = ax.lines[0], ax.lines[1]
    assert raw.get_alpha() < 1 and smoothed.get_alpha() is None
    np.testing.assert_allclose(smoothed.get_ydata(), plots.ema(np.asarray(raw.get_ydata()), 0.8))
    assert ax.get_ylabel() == "Mean reward per response" and ax.get_xlabel() == "RL step"
    assert "EMA 0.8" in ax.get_title()


def relative_luminance(colour: str) -> float:
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def test_palette_has_enough_contrast_on_white_and_is_stable():
    # WCAG 2.1 non-text contrast: (L_white + 0.05) / (L + 0.05) >= 3
    assert all(1.05 / (relative_luminance(c) + 0.05) >= 3.0 for c in plots.PALETTE)
    assert len(set(plots.PALETTE)) == len(plots.PALETTE)
    assert plots.group_colors(["a", "b"]) == {"a": plots.PALETTE[0], "b": plots.PALETTE[1]}


def test_identical_series_are_found():
    import pandas as pd

    rows = []
    for run in ("r1", "r2"):
        for step in range(3):
            value = 0.1 * step + (run == "r2")
            rows += [{"run": run, "step": step, "metric": m, "value": v} for m, v in (
                (keys.SCORE_MEAN, value), (keys.TRAIN_ACCURACY, value), (keys.VAL_ACCURACY, value + 0.01))]
    long = pd.DataFrame(rows)
    assert plots.identical_metrics(long, [keys.SCORE_MEAN, keys.TRAIN_ACCURACY, keys.VAL_ACCURACY]) == {
        keys.TRAIN_ACCURACY: keys.SCORE_MEAN}


def test_report_writes_every_figure_as_png_and_pdf_and_draws_identical_series_once(tmp_path):
    sweep_dir = write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=60)
    for run_dir in sweep_dir.glob("s-a*"):  # make train/accuracy the reward, as on a 0/1-reward task
        import pandas as pd

        frame = pd.read_parquet(run_dir / "metrics.parquet")
        frame[keys.TRAIN_ACCURACY] = frame[keys.SCORE_MEAN]
        frame.to_parquet(run_dir / "metrics.parquet", index=False)
    report = build_report(sweep_dir)
    out = report.parent
    pngs = sorted(p.stem for p in out.glob("fig_*.png"))
    assert pngs and pngs == sorted(p.stem for p in out.glob("fig_*.pdf"))
    assert all((out / f"{stem}.pdf").read_bytes().startswith(b"%PDF") for stem in pngs)
    assert "fig_curve_train_accuracy" not in pngs and "fig_curve_critic_score_mean" in pngs
    assert "`train/accuracy` equals `critic/score/mean`" in report.read_text()
