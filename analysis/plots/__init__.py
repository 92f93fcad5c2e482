"""Matplotlib figures of a sweep. Every helper takes ``ax=None`` (a new figure then) and returns the ``Axes``.

Nothing here calls ``plt.show`` or picks a backend, so the helpers run under Agg (scripts, tests, the report) as well
as inline in a notebook. Shared styling: groups get a colour-blind-safe palette (:data:`PALETTE`) in their sorted
order (the same colour in every figure, each with at least 3:1 contrast on white), titles and axis labels are readable
names with units (:func:`metric_label`), per-step curves can be EMA-smoothed with the raw curve faint behind
(``smoothing``), histograms keep the bin edges the run store logged, and :func:`save_figure` writes PNG and PDF.

Modules: :mod:`~analysis.plots.style` (palette, labels, colours, saving), :mod:`~analysis.plots.lines` (curves,
differences, sample efficiency, a metric against alpha), :mod:`~analysis.plots.histograms` (weight and probability
histograms) and :mod:`~analysis.plots.buckets` (gradient shares and probability changes by bucket); every public
name is importable from ``analysis.plots``.
"""

from __future__ import annotations

from analysis.plots.style import (
    PALETTE,
    METRIC_LABELS,
    STEP_LABEL,
    metric_label,
    group_label,
    group_colors,
    ema,
    save_figure,
    identical_metrics,
    group_color_map,
    close,
)
from analysis.plots.lines import (
    CURVE_STATISTICS,
    plot_curves,
    plot_sample_efficiency,
    plot_curve_difference,
    plot_low_prob_share,
    plot_metric_vs_alpha,
)
from analysis.plots.histograms import (
    rebin_histogram,
    shared_edges,
    histogram_matrix,
    occupied_range,
    plot_histogram_heatmap,
    plot_histogram_heatmaps,
    plot_histogram,
)
from analysis.plots.buckets import (
    GRAD_BUCKET_PATTERN,
    GRAD_BUCKET_STATS,
    GRAD_STAT_LABELS,
    PROB_CHANGE_PATTERN,
    PROB_CHANGE_LABELS,
    ADVANTAGE_SIGN_LABELS,
    grad_bucket_metrics,
    plot_grad_by_bucket,
    prob_change_metrics,
    plot_prob_change,
    available_grad_stats,
)

__all__ = [
    "PALETTE",
    "METRIC_LABELS",
    "STEP_LABEL",
    "metric_label",
    "group_label",
    "group_colors",
    "ema",
    "save_figure",
    "identical_metrics",
    "group_color_map",
    "close",
    "CURVE_STATISTICS",
    "plot_curves",
    "plot_sample_efficiency",
    "plot_curve_difference",
    "plot_low_prob_share",
    "plot_metric_vs_alpha",
    "rebin_histogram",
    "shared_edges",
    "histogram_matrix",
    "occupied_range",
    "plot_histogram_heatmap",
    "plot_histogram_heatmaps",
    "plot_histogram",
    "GRAD_BUCKET_PATTERN",
    "GRAD_BUCKET_STATS",
    "GRAD_STAT_LABELS",
    "PROB_CHANGE_PATTERN",
    "PROB_CHANGE_LABELS",
    "ADVANTAGE_SIGN_LABELS",
    "grad_bucket_metrics",
    "plot_grad_by_bucket",
    "prob_change_metrics",
    "plot_prob_change",
    "available_grad_stats",
]
