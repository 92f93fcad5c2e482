"""Matplotlib figures of a sweep: each takes ``ax=None`` (a new figure) and returns the ``Axes``; none calls
``plt.show`` or picks a backend."""

from __future__ import annotations

from analysis.plots.buckets import (PROB_CHANGE_LABELS, GRAD_BUCKET_STATS, available_grad_stats, grad_bucket_metrics,
                                    plot_grad_by_bucket, plot_prob_change, prob_change_metrics)
from analysis.plots.distributions import histogram_matrix, plot_histogram, plot_histogram_heatmaps, rebin_histogram
from analysis.plots.lines import (plot_curve_difference, plot_curves, plot_low_prob_share, plot_metric_vs_alpha,
                                  plot_sample_efficiency, plot_survival)
from analysis.plots.regime import plot_regime_map, regime_cells
from analysis.plots.style import (PALETTE, close, ema, group_color_map, group_colors, group_label, identical_metrics,
                                  metric_label, save_figure)
