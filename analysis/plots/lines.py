"""Line and point figures: per-step curves, sample-efficiency curves, curve differences against the baseline,
the low-probability share, and a final metric against alpha."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from analysis.curves import CURVE_DIFFERENCE_COLUMNS, aggregate_curves
from analysis.groups import rows_of
from analysis.plots.style import (PALETTE, STEP_LABEL, axes_or_new, ema, group_colors, group_label, group_rows,
                                  metric_label, sorted_groups)
from analysis.statistics import DEFAULT_CONFIDENCE, MIN_SEEDS_FOR_INTERVAL
from dataflex_rl import keys


# statistic -> (its interval columns in aggregate_curves, how the title names them)
CURVE_STATISTICS: dict[str, tuple[str, str, str]] = {
    "mean": ("ci_low", "ci_high", "mean over seeds, {confidence:.0%} Student-t CI"),
    # Tukey-McLaughlin covers about 1 point below nominal at 5-10 seeds (docs/analysis.md): the title says nominal.
    "iqm": ("iqm_ci_low", "iqm_ci_high", "IQM over seeds, nominal {confidence:.0%} Tukey-McLaughlin CI"),
}


def plot_curves(long: pd.DataFrame, metric: str, *, group_keys: Sequence[str] = ("alpha",), ax: Axes | None = None,
                step_grid: Any = None, confidence: float = DEFAULT_CONFIDENCE, band: bool = True,
                smoothing: float | None = None, title: str | None = None, statistic: str = "mean",
                min_seeds: int | None = None) -> Axes:
    """Curve of ``metric`` per group (mean, or ``statistic="iqm"``) with its interval band.

    ``smoothing``: drawn EMA-smoothed over the faint raw curve; ``min_seeds``: a band only at steps with that many."""
    if statistic not in CURVE_STATISTICS:
        raise ValueError(f"statistic={statistic!r} is not one of {sorted(CURVE_STATISTICS)}")
    low_column, high_column, detail = CURVE_STATISTICS[statistic]
    ax = axes_or_new(ax)
    curves = aggregate_curves(long, metric, group_keys=group_keys, step_grid=step_grid, confidence=confidence)
    groups = sorted_groups(curves, group_keys)
    colors = group_colors(groups)
    for group in groups:
        rows = group_rows(curves, group_keys, group)
        label = group_label(group_keys, group) + f" (n={int(rows['n'].max())})"
        if smoothing:
            ax.plot(rows["step"], rows[statistic], color=colors[group], alpha=0.3, linewidth=0.8)
        ax.plot(rows["step"], ema(rows[statistic].to_numpy(), smoothing) if smoothing else rows[statistic],
                color=colors[group], linewidth=1.8, label=label)
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


def plot_sample_efficiency(long: pd.DataFrame, metric: str, *, group_keys: Sequence[str] = ("alpha",),
                           axes: Sequence[Axes] | None = None, step_grid: Any = None,
                           confidence: float = DEFAULT_CONFIDENCE,
                           min_seeds: int | None = MIN_SEEDS_FOR_INTERVAL) -> np.ndarray:
    """rliable-style curves: the mean (left) and the IQM (right) per group with their intervals; returns the axes."""
    if axes is None:
        axes = plt.subplots(1, 2, figsize=(11.0, 4.2), sharey=True, layout="constrained")[1]
    if len(axes) != 2:
        raise ValueError(f"plot_sample_efficiency draws 2 panels (mean, IQM), got {len(axes)} axes")
    for ax, statistic in zip(axes, ("mean", "iqm"), strict=True):
        plot_curves(long, metric, group_keys=group_keys, ax=ax, step_grid=step_grid, confidence=confidence,
                    statistic=statistic, min_seeds=min_seeds, title=metric_label(metric))
    axes[1].set_ylabel("")  # the y-axis is shared
    return np.asarray(axes)


def plot_curve_difference(frame: pd.DataFrame, *, ax: Axes | None = None, color: Any = None,
                          title: str | None = None) -> Axes:
    """One comparison of :func:`analysis.curves.curve_differences`: the mean difference (``ax.lines[0]``), the
    simultaneous band (``ax.collections[0]``), the pointwise interval (``ax.collections[1]``) and a zero line."""
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


def plot_metric_vs_alpha(aggregates: pd.DataFrame, metric: str, *, series_key: str | None = None,
                         statistic: str = "mean", ax: Axes | None = None, per_seed: pd.DataFrame | None = None,
                         value: str = "final_window", reference: float | None = None,
                         reference_label: str = "after SFT", min_span: float | None = None) -> Axes:
    """``metric`` of :func:`~analysis.aggregate.aggregate_runs` against alpha, one series per ``series_key`` value:
    ``per_seed`` dots, the group means with intervals, a dashed ``reference`` line; y spans at least ``min_span``."""
    ax = axes_or_new(ax)
    rows = rows_of(aggregates, "metric", metric)
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
    """One series' ``statistic`` against alpha with its interval; returns the drawn lower and upper ends."""
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
    """Every seed's ``value`` as a dot at its alpha, jittered by up to 4% of the alpha range."""
    x = seeds["alpha"].to_numpy(dtype=np.float64)
    spread = 0.04 * max(1e-9, np.ptp(alphas) if alphas.size > 1 else 1.0)
    jitter = (np.random.default_rng(0).random(x.size) - 0.5) * 2 * spread  # fixed: the figure is reproducible
    y = seeds[value].to_numpy(dtype=np.float64)
    ax.scatter(x + jitter, y, s=18, alpha=0.6, color=color, edgecolors="none", zorder=2, label=label)
    return y


def _honest_ylim(ax: Axes, values: np.ndarray, min_span: float | None) -> None:
    """A y-range holding every value, at least ``min_span`` wide (default 0.1 in [0, 1], else 10%)."""
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


def plot_survival(curves: pd.DataFrame, *, ax: Axes | None = None, title: str = "") -> Axes:
    """Kaplan-Meier curves of :func:`analysis.collapse.survival_curves` (one per ``group``) with their intervals."""
    ax = ax if ax is not None else plt.subplots()[1]
    for (label, curve), color in zip(curves.groupby("group", sort=True), itertools.cycle(PALETTE)):
        ax.step(curve["step"], curve["survival"], where="post", color=color, label=label)
        ax.fill_between(curve["step"], curve["low"], curve["high"], step="post", color=color, alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("share of runs not collapsed")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "Time to collapse (Kaplan-Meier, pointwise intervals)")
    ax.legend(fontsize=7)
    return ax
