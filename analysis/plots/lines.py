"""Line and point figures: per-step curves, sample-efficiency curves, curve differences against the baseline,
the low-probability share, and a final metric against alpha."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from analysis.curves import aggregate_curves
from analysis.plots.style import (
    PALETTE,
    STEP_LABEL,
    axes_or_new,
    ema,
    group_colors,
    group_label,
    group_rows,
    metric_label,
    sorted_groups,
)
from analysis.statistics import DEFAULT_CONFIDENCE, MIN_SEEDS_FOR_INTERVAL, RandomState
from dataflex_rl import keys


# --- curves ------------------------------------------------------------------------------------------------------


# The curve statistics plot_curves draws: (interval columns of aggregate_curves, how the title names them).
CURVE_STATISTICS: dict[str, tuple[str, str, str]] = {
    "mean": ("ci_low", "ci_high", "mean over seeds, {confidence:.0%} Student-t CI"),
    # Tukey-McLaughlin covers about 1 point below nominal at 5-10 seeds (docs/analysis.md): the title says nominal.
    "iqm": ("iqm_ci_low", "iqm_ci_high", "IQM over seeds, nominal {confidence:.0%} Tukey-McLaughlin CI"),
}


def plot_curves(
    long: pd.DataFrame,
    metric: str,
    *,
    group_keys: Sequence[str] = ("alpha",),
    ax: Axes | None = None,
    step_grid: Any = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = 1000,
    random_state: RandomState = 0,
    band: bool = True,
    smoothing: float | None = None,
    title: str | None = None,
    statistic: str = "mean",
    min_seeds: int | None = None,
) -> Axes:
    """Curve of ``metric`` per group over steps (the mean over seeds, or their IQM with ``statistic="iqm"``), with its
    ``confidence`` interval as a band (one line per group), from :func:`analysis.curves.aggregate_curves`: Student t
    for the mean, Tukey-McLaughlin for the IQM.

    Curves are aligned as in :func:`analysis.curves.align_curves` (forward fill within each run, no extrapolation).
    ``smoothing`` (in [0, 1), e.g. 0.9): the curve is drawn EMA-smoothed (:func:`ema`) over the raw one, which stays
    faint behind it with its band; the smoothed line is ``ax.lines[2 * i + 1]`` for group ``i``, the raw one
    ``ax.lines[2 * i]``. ``min_seeds``: the band only at steps with at least this many runs (None: wherever the
    interval is defined, n >= 2). ``title``: default the metric's readable name.
    """
    if statistic not in CURVE_STATISTICS:
        raise ValueError(f"statistic={statistic!r} is not one of {sorted(CURVE_STATISTICS)}")
    low_column, high_column, detail = CURVE_STATISTICS[statistic]
    ax = axes_or_new(ax)
    curves = aggregate_curves(long, metric, group_keys=group_keys, step_grid=step_grid, confidence=confidence,
                              n_bootstrap=n_bootstrap, random_state=random_state)
    groups = sorted_groups(curves, group_keys)
    colors = group_colors(groups)
    for group in groups:
        rows = group_rows(curves, group_keys, group)
        label = group_label(group_keys, group) + f" (n={int(rows['n'].max())})"
        if smoothing:
            ax.plot(rows["step"], rows[statistic], color=colors[group], alpha=0.3, linewidth=0.8)
            ax.plot(rows["step"], ema(rows[statistic].to_numpy(), smoothing), color=colors[group], linewidth=1.8,
                    label=label)
        else:
            ax.plot(rows["step"], rows[statistic], color=colors[group], linewidth=1.8, label=label)
        if band:
            shown = None if min_seeds is None else (rows["n"] >= min_seeds).to_numpy()
            ax.fill_between(rows["step"], rows[low_column], rows[high_column], where=shown, color=colors[group],
                            alpha=0.12 if smoothing else 0.2, linewidth=0)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(metric_label(metric))
    detail = detail.format(confidence=confidence) + (f", EMA {smoothing:g}" if smoothing else "")
    ax.set_title(f"{title or metric_label(metric)}\n({detail})", fontsize="medium")
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.legend(fontsize="small")
    return ax


def plot_sample_efficiency(
    long: pd.DataFrame,
    metric: str,
    *,
    group_keys: Sequence[str] = ("alpha",),
    axes: Sequence[Axes] | None = None,
    step_grid: Any = None,
    confidence: float = DEFAULT_CONFIDENCE,
    min_seeds: int | None = MIN_SEEDS_FOR_INTERVAL,
) -> np.ndarray:
    """Sample-efficiency curves in rliable's style: ``metric`` per group over steps as the mean over seeds (left, with
    its Student-t interval) and as the IQM (right, with its Tukey-McLaughlin interval), on a shared y-axis; bands only
    from ``min_seeds`` runs on. Returns the two axes ``(2,)`` (made in a new figure when ``axes`` is None)."""
    if axes is None:
        _, created = plt.subplots(1, 2, figsize=(11.0, 4.2), sharey=True, layout="constrained")
        axes = created
    if len(axes) != 2:
        raise ValueError(f"plot_sample_efficiency draws 2 panels (mean, IQM), got {len(axes)} axes")
    for ax, statistic in zip(axes, ("mean", "iqm"), strict=True):
        plot_curves(long, metric, group_keys=group_keys, ax=ax, step_grid=step_grid, confidence=confidence,
                    statistic=statistic, min_seeds=min_seeds, title=metric_label(metric))
    axes[1].set_ylabel("")  # the y-axis is shared
    return np.asarray(axes)


def plot_curve_difference(
    frame: pd.DataFrame,
    *,
    ax: Axes | None = None,
    color: Any = None,
    title: str | None = None,
) -> Axes:
    """One comparison of :func:`analysis.curves.curve_differences` (its rows for one group and one metric) over steps:
    the mean paired difference (group minus baseline) as a line with dots, its pointwise interval as a dark band, the
    simultaneous band as a light band around it, and a dashed zero line. ``ax.collections[0]`` is the simultaneous
    band, ``ax.collections[1]`` the pointwise one, ``ax.lines[0]`` the mean difference. ``color``: default the first
    :data:`PALETTE` colour; ``title``: default "<metric>: <group> minus the baseline"."""
    from analysis.curves import CURVE_DIFFERENCE_COLUMNS

    group_keys = [column for column in frame.columns if column not in CURVE_DIFFERENCE_COLUMNS]
    comparisons = frame[[*group_keys, "metric"]].drop_duplicates()
    if len(comparisons) != 1:
        raise ValueError(f"plot_curve_difference draws one comparison; the frame holds {len(comparisons)}: "
                         f"{comparisons.to_dict('records')[:5]} (select one group and metric first)")
    ax = axes_or_new(ax)
    rows = frame.sort_values("step")
    color = PALETTE[0] if color is None else color
    metric = str(rows["metric"].iloc[0])
    confidence = float(rows["confidence"].iloc[0])
    steps = rows["step"].to_numpy()
    counts = rows["n"].to_numpy()
    seeds = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}-{counts.max()}"
    ax.fill_between(steps, rows["band_low"], rows["band_high"], color=color, alpha=0.15, linewidth=0,
                    label=f"{confidence:.0%} simultaneous band ({rows['band_method'].iloc[0]}, "
                          f"{int(rows['band_steps'].iloc[0])} steps)")
    ax.fill_between(steps, rows["ci_low"], rows["ci_high"], color=color, alpha=0.4, linewidth=0,
                    label=f"{confidence:.0%} pointwise interval (paired t)")
    ax.plot(steps, rows["mean_diff"], color=color, linewidth=1.6, marker="o", markersize=3,
            label=f"mean paired difference (n={seeds} seeds)")
    ax.axhline(0.0, color="0.3", linewidth=0.9, linestyle="--", zorder=1)
    group = tuple(rows[key].iloc[0] for key in group_keys)
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(f"\u0394 {metric_label(metric)}\n(group \u2212 baseline)")
    ax.set_title(title or f"{metric_label(metric)}: {group_label(group_keys, group)} minus the baseline",
                 fontsize="medium")
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.legend(fontsize="small")
    return ax


def plot_low_prob_share(long: pd.DataFrame, **kwargs: Any) -> Axes:
    """Share of low-probability tokens over training (``dataflex/token_prob/low_frac``) per group."""
    return plot_curves(long, keys.TOKEN_PROB_LOW_FRAC, **kwargs)


def plot_metric_vs_alpha(
    aggregates: pd.DataFrame,
    metric: str,
    *,
    series_key: str | None = None,
    statistic: str = "mean",
    ax: Axes | None = None,
    per_seed: pd.DataFrame | None = None,
    value: str = "final_window",
    reference: float | None = None,
    reference_label: str = "after SFT",
    min_span: float | None = None,
) -> Axes:
    """``metric`` (from :func:`analysis.aggregate.aggregate_runs`) against alpha: every seed as a dot, the group mean,
    and its interval only where there are enough seeds for one.

    One series per value of ``series_key`` (e.g. ``mechanism_label``), or a single one when None. ``per_seed``: the
    run summaries (:func:`analysis.aggregate.run_summaries`) whose ``value`` column gives the dots. Error bars: the
    Student-t interval (``statistic="mean"``) or the BCa IQM interval, drawn only from
    ``MIN_SEEDS_FOR_INTERVAL`` seeds. ``reference``: a horizontal dashed line (e.g. the accuracy after SFT). The y-axis
    does not exaggerate: it spans at least ``min_span`` (default 0.1 for a metric in [0, 1], e.g. 10 accuracy points,
    so that a few validation items cannot fill the plot; else 10% of the largest magnitude), and holds every dot and
    the reference.
    """
    ax = axes_or_new(ax)
    rows = aggregates[aggregates["metric"].astype(str) == metric]
    if rows.empty:
        raise KeyError(f"metric={metric!r} is not in the aggregates; available: "
                       f"{sorted(aggregates['metric'].astype(str).unique())}")
    series = [None] if series_key is None else sorted(rows[series_key].astype(str).unique())
    colors = group_colors(series)
    shown: list[np.ndarray] = []
    dots = None if per_seed is None else per_seed[per_seed["metric"].astype(str) == metric]
    for name in series:
        part = rows if name is None else rows[rows[series_key].astype(str) == name]
        part = part.sort_values("alpha")
        shown += _alpha_errorbars(ax, part, statistic, color=colors[name],
                                  label=f"{statistic} ± interval" if name is None else str(name))
        if dots is not None and len(dots):
            seeds = dots if name is None else dots[dots[series_key].astype(str) == name]
            shown.append(_seed_dots(ax, seeds, value, part["alpha"].to_numpy(dtype=np.float64), color=colors[name],
                                    label="one seed" if name is None else None))
    if reference is not None and np.isfinite(reference):
        ax.axhline(reference, color="0.4", linestyle="--", linewidth=1.0, label=reference_label, zorder=1)
        shown.append(np.array([reference]))
    _honest_ylim(ax, np.concatenate([np.ravel(v) for v in shown]), min_span)
    ax.set_xlabel("alpha")
    ax.set_ylabel(f"{metric} ({value.replace('_', ' ')})")
    ax.set_title(f"{metric} against alpha (dots: seeds)")
    ax.legend(fontsize="small")
    return ax


def _alpha_errorbars(ax: Axes, part: pd.DataFrame, statistic: str, *, color: Any, label: str) -> list[np.ndarray]:
    """One series' group ``statistic`` against alpha with its interval (none below ``MIN_SEEDS_FOR_INTERVAL`` seeds);
    returns the drawn lower and upper ends, for the y-axis."""
    low_column, high_column = ("ci_low", "ci_high") if statistic == "mean" else ("iqm_ci_low", "iqm_ci_high")
    alphas = part["alpha"].to_numpy(dtype=np.float64)
    center = part[statistic].to_numpy(dtype=np.float64)
    enough = part["n"].to_numpy() >= MIN_SEEDS_FOR_INTERVAL
    error = np.vstack([center - part[low_column].to_numpy(dtype=np.float64),
                       part[high_column].to_numpy(dtype=np.float64) - center])
    error = np.where(enough & np.isfinite(error), np.clip(error, 0.0, None), 0.0)
    ax.errorbar(alphas, center, yerr=error, marker="D", markersize=6, capsize=4, linewidth=1.2,
                color=color, label=label, zorder=3)
    return [center - error[0], center + error[1]]


def _seed_dots(ax: Axes, seeds: pd.DataFrame, value: str, alphas: np.ndarray, *, color: Any,
               label: str | None) -> np.ndarray:
    """Every seed's ``value`` as a dot at its alpha, jittered by up to 4% of the alpha range; returns the values."""
    x = seeds["alpha"].to_numpy(dtype=np.float64)
    spread = 0.04 * max(1e-9, np.ptp(alphas) if alphas.size > 1 else 1.0)
    jitter = (np.random.default_rng(0).random(x.size) - 0.5) * 2 * spread  # fixed: the figure is reproducible
    y = seeds[value].to_numpy(dtype=np.float64)
    ax.scatter(x + jitter, y, s=18, alpha=0.6, color=color, edgecolors="none", zorder=2, label=label)
    return y


def _honest_ylim(ax: Axes, values: np.ndarray, min_span: float | None) -> None:
    """A y-range holding every value and at least ``min_span`` wide (default 0.1 for values in [0, 1], else 10% of
    the largest magnitude), kept inside [0, 1] for such values, so a small difference cannot fill the plot."""
    values = values[np.isfinite(values)]
    if not values.size:
        return
    low, high = float(values.min()), float(values.max())
    unit_range = low >= 0.0 and high <= 1.0
    span = min_span if min_span is not None else (0.1 if unit_range else 0.1 * max(abs(low), abs(high), 1e-12))
    middle, half = (low + high) / 2.0, max(span, 1.1 * (high - low)) / 2.0
    bottom, top = middle - half, middle + half
    if unit_range:  # keep [0, 1] metrics inside [0, 1] without shrinking the span
        bottom, top = (0.0, 2 * half) if bottom < 0 else (bottom, top)
        bottom, top = (1.0 - 2 * half, 1.0) if top > 1 else (bottom, top)
    ax.set_ylim(bottom, top)
