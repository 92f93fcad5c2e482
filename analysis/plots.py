"""Matplotlib figures of a sweep. Every helper takes ``ax=None`` (a new figure then) and returns the ``Axes``.

Nothing here calls ``plt.show`` or picks a backend, so the helpers run under Agg (scripts, tests, the report) as well
as inline in a notebook. Colours follow the sorted order of the groups (viridis), the same in every figure.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import PowerNorm

from analysis.aggregate import (
    DEFAULT_CONFIDENCE,
    DEFAULT_FINAL_WINDOW,
    RandomState,
    aggregate_curves,
    aggregate_runs,
    run_summaries,
)
from dataflex_rl import keys

GRAD_BUCKET_PATTERN = re.compile(
    rf"^{re.escape(keys.GRAD_BY_PROB_PREFIX)}/(?P<low>-?[0-9.]+)-(?P<high>-?[0-9.]+)/(?P<stat>[A-Za-z_]+)$")
# Per-bucket statistics drawn as bars (``keys.grad_by_prob``): the closed-form and exact gradient-norm shares (local
# backend) and the logit-gradient bound ``mean |A w| (1 - pi)`` (both backends).
GRAD_BUCKET_STATS: tuple[str, ...] = ("logit_grad_norm_share", "param_grad_share", "logit_grad_bound")


def _axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    _, new_ax = plt.subplots()
    return new_ax


def group_label(group_keys: Sequence[str], values: Sequence[Any]) -> str:
    """``alpha=0.5`` or ``ar, alpha=0.5`` (a mechanism label is shown bare)."""
    parts = []
    for key, value in zip(group_keys, values, strict=True):
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(text if key == "mechanism_label" else f"{key}={text}")
    return ", ".join(parts)


def group_colors(groups: Sequence[Any]) -> dict[Any, Any]:
    """One viridis colour per group, in the given order."""
    colormap = plt.get_cmap("viridis")
    count = max(len(groups) - 1, 1)
    return {group: colormap(0.9 * index / count) for index, group in enumerate(groups)}


def _sorted_groups(frame: pd.DataFrame, group_keys: Sequence[str]) -> list[tuple[Any, ...]]:
    unique = frame[list(group_keys)].drop_duplicates().sort_values(list(group_keys))
    return [tuple(row) for row in unique.itertuples(index=False)]


def _rows_of(frame: pd.DataFrame, group_keys: Sequence[str], group: tuple[Any, ...]) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for key, value in zip(group_keys, group, strict=True):
        column = frame[key]
        if isinstance(value, float) and np.isnan(value):
            mask &= column.isna().to_numpy()
        else:
            mask &= (column == value).to_numpy(dtype=bool, na_value=False)
    return frame[mask]


# --- curves ------------------------------------------------------------------------------------------------------


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
) -> Axes:
    """Mean curve of ``metric`` per group over steps, with a bootstrap ``confidence`` band (one line per group).

    Curves are aligned as in :func:`analysis.aggregate.align_curves` (forward fill within each run, no extrapolation).
    """
    ax = _axes(ax)
    curves = aggregate_curves(long, metric, group_keys=group_keys, step_grid=step_grid, confidence=confidence,
                              n_bootstrap=n_bootstrap, random_state=random_state)
    groups = _sorted_groups(curves, group_keys)
    colors = group_colors(groups)
    for group in groups:
        rows = _rows_of(curves, group_keys, group)
        label = group_label(group_keys, group) + f" (n={int(rows['n'].max())})"
        ax.plot(rows["step"], rows["mean"], color=colors[group], label=label)
        if band:
            ax.fill_between(rows["step"], rows["ci_low"], rows["ci_high"], color=colors[group], alpha=0.2,
                            linewidth=0)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} (mean, {confidence:.0%} CI)")
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
    from analysis.aggregate import MIN_SEEDS_FOR_INTERVAL

    ax = _axes(ax)
    rows = aggregates[aggregates["metric"].astype(str) == metric]
    if rows.empty:
        raise KeyError(f"metric={metric!r} is not in the aggregates; available: "
                       f"{sorted(aggregates['metric'].astype(str).unique())}")
    low_column, high_column = ("ci_low", "ci_high") if statistic == "mean" else ("iqm_ci_low", "iqm_ci_high")
    series = [None] if series_key is None else sorted(rows[series_key].astype(str).unique())
    colors = group_colors(series)
    shown: list[np.ndarray] = []
    dots = None if per_seed is None else per_seed[per_seed["metric"].astype(str) == metric]
    for name in series:
        part = rows if name is None else rows[rows[series_key].astype(str) == name]
        part = part.sort_values("alpha")
        alphas = part["alpha"].to_numpy(dtype=np.float64)
        center = part[statistic].to_numpy(dtype=np.float64)
        enough = part["n"].to_numpy() >= MIN_SEEDS_FOR_INTERVAL
        error = np.vstack([center - part[low_column].to_numpy(dtype=np.float64),
                           part[high_column].to_numpy(dtype=np.float64) - center])
        error = np.where(enough & np.isfinite(error), np.clip(error, 0.0, None), 0.0)
        ax.errorbar(alphas, center, yerr=error, marker="D", markersize=6, capsize=4, linewidth=1.2,
                    color=colors[name], label=f"{statistic} ± interval" if name is None else str(name), zorder=3)
        shown.append(center - error[0])
        shown.append(center + error[1])
        if dots is not None and len(dots):
            seeds = dots if name is None else dots[dots[series_key].astype(str) == name]
            x = seeds["alpha"].to_numpy(dtype=np.float64)
            spread = 0.04 * max(1e-9, np.ptp(alphas) if alphas.size > 1 else 1.0)
            jitter = (np.random.default_rng(0).random(x.size) - 0.5) * 2 * spread  # fixed: the figure is reproducible
            y = seeds[value].to_numpy(dtype=np.float64)
            ax.scatter(x + jitter, y, s=18, alpha=0.6, color=colors[name], edgecolors="none", zorder=2,
                       label="one seed" if name is None else None)
            shown.append(y)
    if reference is not None and np.isfinite(reference):
        ax.axhline(reference, color="0.4", linestyle="--", linewidth=1.0, label=reference_label, zorder=1)
        shown.append(np.array([reference]))
    values = np.concatenate([np.ravel(v) for v in shown])
    values = values[np.isfinite(values)]
    if values.size:
        low, high = float(values.min()), float(values.max())
        unit_range = low >= 0.0 and high <= 1.0
        span = min_span if min_span is not None else (0.1 if unit_range else 0.1 * max(abs(low), abs(high), 1e-12))
        middle, half = (low + high) / 2.0, max(span, 1.1 * (high - low)) / 2.0
        bottom, top = middle - half, middle + half
        if unit_range:  # keep [0, 1] metrics inside [0, 1] without shrinking the span
            bottom, top = (0.0, 2 * half) if bottom < 0 else (bottom, top)
            bottom, top = (1.0 - 2 * half, 1.0) if top > 1 else (bottom, top)
        ax.set_ylim(bottom, top)
    ax.set_xlabel("alpha")
    ax.set_ylabel(f"{metric} ({value.replace('_', ' ')})")
    ax.set_title(f"{metric} against alpha (dots: seeds)")
    ax.legend(fontsize="small")
    return ax


# --- histograms --------------------------------------------------------------------------------------------------


def rebin_histogram(edges: np.ndarray, counts: np.ndarray, new_edges: np.ndarray) -> np.ndarray:
    """Counts ``(k,)`` on ``edges`` ``(k+1,)`` -> counts ``(len(new_edges)-1,)`` on ``new_edges``.

    Assumes counts spread uniformly inside each bin: the cumulative count is interpolated linearly at the new edges
    (mass outside ``new_edges`` is dropped).
    """
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(counts, dtype=np.float64))])
    return np.diff(np.interp(new_edges, np.asarray(edges, dtype=np.float64), cumulative))


def _common_edges(rows: pd.DataFrame, bins: int) -> np.ndarray:
    """``bins`` equal bins ``(bins+1,)`` spanning every histogram's edges in ``rows``."""
    low = min(float(np.min(e)) for e in rows["edges"])
    high = max(float(np.max(e)) for e in rows["edges"])
    return np.linspace(low, high if high > low else low + 1.0, bins + 1)


def histogram_matrix(
    histograms: pd.DataFrame, name: str, bins: int = 50, edges: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Histograms ``name`` of the given rows -> ``(steps (s,), edges (bins+1,), fractions (s, bins))``.

    Every (run, step) histogram is rebinned onto ``edges`` (default ``bins`` equal bins spanning all its edges), turned
    into fractions (rows sum to 1) and averaged over runs at each step.
    """
    rows = histograms[histograms["name"].astype(str) == name]
    if rows.empty:
        raise KeyError(f"histogram name={name!r} is not in the table; available: "
                       f"{sorted(histograms['name'].astype(str).unique())}")
    edges = _common_edges(rows, bins) if edges is None else np.asarray(edges, dtype=np.float64)
    bins = edges.size - 1
    steps = np.sort(rows["step"].unique())
    index = {int(step): i for i, step in enumerate(steps)}
    totals = np.zeros((steps.size, bins))
    runs_per_step = np.zeros(steps.size)
    for step, run_edges, counts in zip(rows["step"], rows["edges"], rows["counts"], strict=True):
        rebinned = rebin_histogram(run_edges, counts, edges)
        mass = rebinned.sum()
        if mass > 0:
            totals[index[int(step)]] += rebinned / mass
            runs_per_step[index[int(step)]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        fractions = totals / runs_per_step[:, None]
    return steps, edges, fractions


def plot_histogram_heatmap(
    histograms: pd.DataFrame,
    name: str,
    *,
    ax: Axes | None = None,
    bins: int = 50,
    vmax: float | None = None,
    colorbar: bool = True,
    edges: np.ndarray | None = None,
) -> Axes:
    """Heatmap of histogram ``name`` over training (x step, y value, colour = fraction of tokens), averaged over
    the runs in ``histograms`` (filter it to one group first). ``edges``: value bins (default ``bins`` equal bins
    over the data). The mesh is ``ax.collections[0]``."""
    ax = _axes(ax)
    steps, edges, fractions = histogram_matrix(histograms, name, bins, edges)
    step_edges = _cell_edges(steps.astype(np.float64))
    # A square-root colour scale keeps spread-out distributions visible beside a single spike (alpha = 0: all 1).
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    mesh = ax.pcolormesh(step_edges, edges, fractions.T, shading="flat", cmap="magma", norm=norm)
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label="fraction (sqrt scale)")
    ax.set_xlabel("step")
    ax.set_ylabel(name.rsplit("/", 1)[-1])
    return ax


def _cell_edges(centers: np.ndarray) -> np.ndarray:
    """Edges ``(n+1,)`` around cell centres ``(n,)``: midpoints, with the end cells mirrored."""
    if centers.size == 1:
        return np.array([centers[0] - 0.5, centers[0] + 0.5])
    middle = (centers[1:] + centers[:-1]) / 2.0
    return np.concatenate([[2 * centers[0] - middle[0]], middle, [2 * centers[-1] - middle[-1]]])


def plot_histogram_heatmaps(
    histograms: pd.DataFrame,
    name: str,
    *,
    group_keys: Sequence[str] = ("alpha",),
    axes: Sequence[Axes] | None = None,
    bins: int = 50,
) -> np.ndarray:
    """One :func:`plot_histogram_heatmap` per group on a shared colour scale (one colour bar); returns the axes
    ``(n_groups,)``."""
    rows = histograms[histograms["name"].astype(str) == name]
    if rows.empty:
        raise KeyError(f"histogram name={name!r} is not in the table; available: "
                       f"{sorted(histograms['name'].astype(str).unique())}")
    groups = _sorted_groups(rows, group_keys)
    if axes is None:
        _, created = plt.subplots(1, len(groups), figsize=(3.6 * len(groups) + 1.0, 3.5), squeeze=False,
                                  sharey=True, layout="constrained")
        axes = created[0]
    if len(axes) != len(groups):
        raise ValueError(f"got {len(axes)} axes for {len(groups)} groups of {list(group_keys)}")
    edges = _common_edges(rows, bins)
    with np.errstate(invalid="ignore"):
        peaks = [np.nanmax(histogram_matrix(_rows_of(rows, group_keys, g), name, edges=edges)[2], initial=0.0)
                 for g in groups]
    vmax = max(float(peak) for peak in peaks) or None
    for ax, group in zip(axes, groups, strict=True):
        plot_histogram_heatmap(_rows_of(rows, group_keys, group), name, ax=ax, vmax=vmax, colorbar=False,
                               edges=edges)
        ax.set_title(group_label(group_keys, group))
    axes = np.asarray(axes)
    axes[0].figure.colorbar(axes[-1].collections[0], ax=list(axes), label="fraction (sqrt scale)")
    for ax in axes[1:]:
        ax.set_ylabel("")
    return axes


def plot_histogram(
    histograms: pd.DataFrame,
    name: str,
    *,
    step: int | None = None,
    group_keys: Sequence[str] = ("alpha",),
    ax: Axes | None = None,
    bins: int = 50,
) -> Axes:
    """Histogram ``name`` at ``step`` (default: each group's last logged step) averaged over runs, one line per
    group (e.g. the token-probability distribution at the end of training)."""
    ax = _axes(ax)
    rows = histograms[histograms["name"].astype(str) == name]
    if rows.empty:
        raise KeyError(f"histogram name={name!r} is not in the table; available: "
                       f"{sorted(histograms['name'].astype(str).unique())}")
    groups = _sorted_groups(rows, group_keys)
    colors = group_colors(groups)
    edges = _common_edges(rows, bins)
    for group in groups:
        part = _rows_of(rows, group_keys, group)
        chosen = int(part["step"].max()) if step is None else step
        part = part[part["step"] == chosen]
        if part.empty:
            continue
        fractions = np.zeros(bins)
        for run_edges, counts in zip(part["edges"], part["counts"], strict=True):
            rebinned = rebin_histogram(run_edges, counts, edges)
            fractions += rebinned / max(rebinned.sum(), 1e-12)
        ax.stairs(fractions / len(part), edges, color=colors[group],
                  label=f"{group_label(group_keys, group)} (step {chosen})")
    ax.set_xlabel(name.rsplit("/", 1)[-1])
    ax.set_ylabel("fraction")
    ax.set_title(name)
    ax.legend(fontsize="small")
    return ax


# --- gradient statistics by token probability -------------------------------------------------------------------


def grad_bucket_metrics(metric_names: Collection[str], stat: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every ``grad_norm/by_prob/<low>-<high>/<stat>`` key, sorted by ``low``."""
    found = []
    for name in metric_names:
        match = GRAD_BUCKET_PATTERN.match(str(name))
        if match and match["stat"] == stat:
            found.append((str(name), float(match["low"]), float(match["high"])))
    return sorted(found, key=lambda item: item[1])


def plot_grad_by_bucket(
    long: pd.DataFrame,
    *,
    stat: str = "logit_grad_norm_share",
    value: str = "auc",
    group_keys: Sequence[str] = ("alpha",),
    final_window: int = DEFAULT_FINAL_WINDOW,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = 2000,
    random_state: RandomState = 0,
    ax: Axes | None = None,
) -> Axes:
    """Bars of ``grad_norm/by_prob/<bucket>/<stat>`` per probability bucket, one bar series per group, CI error bars
    (the paper's Fig. 1d with ``stat`` = ``logit_grad_norm_share`` or ``param_grad_share``; ``logit_grad_bound`` where
    only the verl backend's bound is logged).

    ``value``: the per-run summary plotted (:data:`analysis.aggregate.SUMMARY_STATISTICS`); the default ``auc`` is the
    run's time-averaged share over training, ``final_window`` its share at the end.
    """
    buckets = grad_bucket_metrics(long["metric"].unique(), stat)
    if not buckets:
        raise KeyError(f"no '{keys.GRAD_BY_PROB_PREFIX}/<low>-<high>/{stat}' metric in the table")
    ax = _axes(ax)
    summaries = run_summaries(long, metrics=[b[0] for b in buckets], final_window=final_window)
    aggregates = aggregate_runs(summaries, value=value, group_keys=group_keys, confidence=confidence,
                                n_bootstrap=n_bootstrap, random_state=random_state)
    groups = _sorted_groups(aggregates, group_keys)
    colors = group_colors(groups)
    width = 0.8 / len(groups)
    positions = np.arange(len(buckets), dtype=np.float64)
    for index, group in enumerate(groups):
        part = _rows_of(aggregates, group_keys, group)
        by_metric = {str(m): row for m, (_, row) in zip(part["metric"], part.iterrows(), strict=True)}
        center = np.array([by_metric[b[0]]["mean"] if b[0] in by_metric else np.nan for b in buckets])
        low = np.array([by_metric[b[0]]["ci_low"] if b[0] in by_metric else np.nan for b in buckets])
        high = np.array([by_metric[b[0]]["ci_high"] if b[0] in by_metric else np.nan for b in buckets])
        ax.bar(positions + (index - (len(groups) - 1) / 2) * width, center, width=width, color=colors[group],
               yerr=np.clip(np.vstack([center - low, high - center]), 0.0, None), capsize=2,
               label=group_label(group_keys, group))
    ax.set_xticks(positions, [f"[{b[1]:.2f}, {b[2]:.2f})" for b in buckets])
    ax.set_xlabel("token probability bucket")
    ax.set_ylabel(f"{stat} ({value})")
    ax.set_title(f"{keys.GRAD_BY_PROB_PREFIX}/*/{stat}")
    ax.legend(fontsize="small")
    return ax


def available_grad_stats(metric_names: Collection[str], stats: Sequence[str] = GRAD_BUCKET_STATS) -> list[str]:
    """Those of ``stats`` (default :data:`GRAD_BUCKET_STATS`) with at least one bucket among ``metric_names``."""
    return [stat for stat in stats if grad_bucket_metrics(metric_names, stat)]


def close(ax_or_axes: Axes | np.ndarray | Mapping[str, Axes]) -> None:
    """Close the figure(s) behind axes made with ``ax=None`` (pyplot keeps them alive until closed)."""
    items = ax_or_axes.values() if isinstance(ax_or_axes, Mapping) else np.atleast_1d(ax_or_axes).ravel()
    for ax in items:
        plt.close(ax.figure)
