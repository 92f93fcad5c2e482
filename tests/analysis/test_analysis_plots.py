"""Plot helpers return the axes they drew on, with one line / bar series / mesh per group."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import QuadMesh
from matplotlib.container import BarContainer, ErrorbarContainer

from analysis import aggregate, frames, load, plots
from analysis.curves import aggregate_curves
from dataflex_rl import keys


@pytest.fixture
def data(complete_sweep: Path) -> frames.SweepData:
    return load.load_sweep(complete_sweep)


@pytest.fixture(autouse=True)
def close_figures() -> None:
    yield
    plt.close("all")


def test_plot_curves_one_line_and_band_per_alpha(data: frames.SweepData) -> None:
    _, ax = plt.subplots()
    returned = plots.plot_curves(data.metrics, keys.VAL_ACCURACY, ax=ax)
    assert returned is ax
    assert len(ax.lines) == 3 and len(ax.collections) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["alpha=0 (n=3)", "alpha=0.5 (n=3)", "alpha=1 (n=3)"]
    curves = aggregate_curves(data.metrics, keys.VAL_ACCURACY)
    first = curves[curves["alpha"] == 0.0]
    np.testing.assert_allclose(ax.lines[0].get_ydata(), first["mean"])
    new_ax = plots.plot_low_prob_share(data.metrics, band=False)
    assert new_ax is not ax and len(new_ax.lines) == 3 and not new_ax.collections


def test_plot_metric_vs_alpha_one_series_per_label(data: frames.SweepData) -> None:
    summaries = aggregate.run_summaries(data.metrics, metrics=[keys.VAL_ACCURACY])
    labelled = pd.concat([summaries.assign(mechanism_label="ar"), summaries.assign(mechanism_label="lopti")])
    aggregates = aggregate.aggregate_runs(labelled, group_keys=("mechanism_label", "alpha"), n_bootstrap=100)
    ax = plots.plot_metric_vs_alpha(aggregates, keys.VAL_ACCURACY, series_key="mechanism_label")
    containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(containers) == 2
    np.testing.assert_allclose(containers[0].lines[0].get_xdata(), [0.0, 0.5, 1.0])
    with pytest.raises(KeyError, match="available"):
        plots.plot_metric_vs_alpha(aggregates, "missing")


def test_rebin_histogram_by_hand() -> None:
    # counts 2 on [0,1) and 4 on [1,2); cumulative (0, 2, 6) read at 0, 0.5, 2 -> (0, 1, 6) -> counts (1, 5)
    np.testing.assert_allclose(plots.rebin_histogram(np.array([0.0, 1.0, 2.0]), np.array([2, 4]),
                                                     np.array([0.0, 0.5, 2.0])), [1.0, 5.0])


def test_histogram_heatmaps_and_histogram(data: frames.SweepData) -> None:
    axes = plots.plot_histogram_heatmaps(data.histograms, keys.HIST_WEIGHT, bins=16)
    assert axes.shape == (3,)
    meshes = [c for c in axes[0].collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 1 and meshes[0].get_array().shape == (16, 3)  # 16 bins x 3 logged steps (0, 10, 20)
    steps, edges, fractions = plots.histogram_matrix(data.histograms, keys.HIST_WEIGHT, bins=16)
    np.testing.assert_allclose(fractions.sum(axis=1), 1.0)
    assert steps.tolist() == [0, 10, 20] and edges.shape == (17,)
    ax = plots.plot_histogram(data.histograms, keys.HIST_TOKEN_PROB, bins=10)
    assert len(ax.patches) == 3  # one step outline per alpha
    with pytest.raises(KeyError, match="available"):
        plots.plot_histogram(data.histograms, "dataflex/hist/none")


def test_grad_by_bucket_bars(data: frames.SweepData) -> None:
    ax = plots.plot_grad_by_bucket(data.metrics, stat="logit_grad_norm_share", n_bootstrap=100)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 3 and all(len(b) == 4 for b in bars)  # 3 alphas x 4 buckets
    summaries = aggregate.run_summaries(data.metrics, metrics=[keys.grad_by_prob("0.00-0.25", "logit_grad_norm_share")])
    expected = summaries[summaries["alpha"] == 0.0]["auc"].mean()
    assert bars[0][0].get_height() == pytest.approx(expected)
    assert plots.available_grad_stats(data.metric_names) == [
        "logit_grad_norm_share", "param_grad_share", "logit_grad_bound"]
    assert [b[1:] for b in plots.grad_bucket_metrics(["grad_norm/by_prob/0.50-0.75/x", "grad_norm/by_prob/0.00-0.50/x",
                                                      "grad_norm/by_prob/low_prob_share"], "x")] == [(0.0, 0.5),
                                                                                                     (0.5, 0.75)]
    with pytest.raises(KeyError, match="param_grad_norm"):
        plots.plot_grad_by_bucket(data.metrics, stat="param_grad_norm")
