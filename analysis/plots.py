"""Matplotlib figures of a sweep. Every helper takes ``ax=None`` (a new figure then) and returns the ``Axes``.

Nothing here calls ``plt.show`` or picks a backend, so the helpers run under Agg (scripts, tests, the report) as well
as inline in a notebook. Shared styling: groups get a colour-blind-safe palette (:data:`PALETTE`) in their sorted
order (the same colour in every figure, each with at least 3:1 contrast on white), titles and axis labels are readable
names with units (:func:`metric_label`), per-step curves can be EMA-smoothed with the raw curve faint behind
(``smoothing``), histograms keep the bin edges the run store logged, and :func:`save_figure` writes PNG and PDF.
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

from analysis.aggregate import DEFAULT_FINAL_WINDOW, aggregate_runs, run_summaries
from analysis.curves import aggregate_curves
from analysis.statistics import DEFAULT_CONFIDENCE, MIN_SEEDS_FOR_INTERVAL, RandomState
from dataflex_rl import keys

GRAD_BUCKET_PATTERN = re.compile(
    rf"^{re.escape(keys.GRAD_BY_PROB_PREFIX)}/(?P<low>-?[0-9.]+)-(?P<high>-?[0-9.]+)/(?P<stat>[A-Za-z_]+)$")
# Per-bucket statistics drawn as bars (``keys.grad_by_prob``): the closed-form and exact gradient-norm shares (local
# backend) and the logit-gradient bound ``mean |A w| (1 - pi)`` (both backends).
GRAD_BUCKET_STATS: tuple[str, ...] = ("logit_grad_norm_share", "param_grad_share", "logit_grad_bound")

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies. Only
# its colours with at least 3:1 contrast on white (WCAG 2.1 for graphics) are kept: blue, vermillion, bluish green,
# reddish purple, black; orange (2.2:1), sky blue (2.3:1) and yellow (1.3:1) are too pale. Paul Tol's dark wine and
# indigo follow for sweeps with more groups.
PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#882255", "#332288")
# Readable names (with units) of the metrics the report draws; any other key is shown as it is.
METRIC_LABELS: dict[str, str] = {
    keys.VAL_ACCURACY: "Validation accuracy (fraction correct)",
    keys.SCORE_MEAN: "Mean reward per response",
    keys.TRAIN_ACCURACY: "Training accuracy (fraction correct)",
    keys.RESPONSE_LENGTH_MEAN: "Response length (tokens)",
    keys.TOKEN_PROB_LOW_FRAC: "Share of tokens with \u03c0 < 0.5",
    keys.TOKEN_PROB_MEAN: "Mean token probability \u03c0",
    keys.GRAD_NORM: "Gradient norm before clipping",
    keys.HIST_WEIGHT: "Advantage weight w",
    keys.HIST_TOKEN_PROB: "Token probability \u03c0",
}
GRAD_STAT_LABELS: dict[str, str] = {
    "logit_grad_norm_share": "Share of the logit-gradient norm",
    "param_grad_share": "Share of the parameter-gradient norm",
    "logit_grad_bound": "Logit-gradient bound mean |A w| (1 - \u03c0)",
}
STEP_LABEL = "RL step"
PROB_CHANGE_PATTERN = re.compile(
    rf"^{re.escape(keys.PROB_CHANGE_PREFIX)}/(?P<sign>pos|neg)/(?P<low>[0-9.]+)-(?P<high>[0-9.]+)/(?P<stat>[A-Za-z_]+)$")
PROB_CHANGE_LABELS: dict[str, str] = {
    "correct_share": "Share of tokens whose \u03c0 moved with their advantage",
    "mean_delta": "Mean change of \u03c0 in one update",
}
ADVANTAGE_SIGN_LABELS = {"pos": "positive advantage (\u03c0 should rise)", "neg": "negative advantage (\u03c0 should fall)"}


def metric_label(metric: str) -> str:
    """A readable name with units for a metric key (the key itself when none is known)."""
    return METRIC_LABELS.get(metric, metric)


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
    """One :data:`PALETTE` colour per group, in the given order (cycling past seven groups)."""
    return {group: PALETTE[index % len(PALETTE)] for index, group in enumerate(groups)}


def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Debiased exponential moving average ``(n,)`` -> ``(n,)``, as W&B and TensorBoard smooth curves:
    ``s_t = smoothing * s_(t-1) + (1 - smoothing) * x_t`` from ``s_0 = 0``, divided by ``1 - smoothing^(t+1)``
    (so the start is not pulled towards 0). NaNs are skipped (the average carries over them)."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing!r} must be in [0, 1)")
    values = np.asarray(values, dtype=np.float64)
    smoothed = np.full(values.shape, np.nan)
    state, weight = 0.0, 0.0
    for index, value in enumerate(values):
        if np.isfinite(value):
            state = smoothing * state + (1.0 - smoothing) * value
            weight = smoothing * weight + (1.0 - smoothing)
        if weight > 0:
            smoothed[index] = state / weight
    return smoothed


def save_figure(figure: Any, stem: str | Any, dpi: int = 200) -> list[Any]:
    """Write ``<stem>.png`` (``dpi``) and ``<stem>.pdf`` (vector); return both paths."""
    from pathlib import Path

    stem = Path(stem)
    paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")]
    figure.savefig(paths[0], dpi=dpi, bbox_inches="tight")
    figure.savefig(paths[1], bbox_inches="tight")
    return paths


def identical_metrics(long: pd.DataFrame, metrics: Sequence[str]) -> dict[str, str]:
    """``{metric: earlier metric}`` for each of ``metrics`` whose (run, step, value) rows equal those of an earlier
    one in the list (e.g. ``train/accuracy`` and the reward on a 0/1-reward task), so a report draws it once."""
    series: dict[str, pd.Series] = {}
    duplicates: dict[str, str] = {}
    for metric in metrics:
        rows = long[long["metric"].astype(str) == metric]
        if rows.empty:
            continue
        values = rows.set_index([rows["run"].astype(str), rows["step"]])["value"].sort_index()
        same = next((name for name, other in series.items() if len(other) == len(values)
                     and other.index.equals(values.index) and np.allclose(other.to_numpy(), values.to_numpy())), None)
        if same is not None:
            duplicates[metric] = same
        else:
            series[metric] = values
    return duplicates


def _sorted_groups(frame: pd.DataFrame, group_keys: Sequence[str]) -> list[tuple[Any, ...]]:
    unique = frame[list(group_keys)].drop_duplicates().sort_values(list(group_keys))
    return [tuple(row) for row in unique.itertuples(index=False)]


def group_color_map(frame: pd.DataFrame, group_keys: Sequence[str]) -> dict[tuple[Any, ...], Any]:
    """``{group key tuple: colour}`` for the groups of ``frame`` in sorted order: the colour each group gets in the
    per-group figures of the same rows (:func:`plot_curves` and friends)."""
    return group_colors(_sorted_groups(frame, group_keys))


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
    ax = _axes(ax)
    curves = aggregate_curves(long, metric, group_keys=group_keys, step_grid=step_grid, confidence=confidence,
                              n_bootstrap=n_bootstrap, random_state=random_state)
    groups = _sorted_groups(curves, group_keys)
    colors = group_colors(groups)
    for group in groups:
        rows = _rows_of(curves, group_keys, group)
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
    ax = _axes(ax)
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
    ax = _axes(ax)
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


def shared_edges(rows: pd.DataFrame) -> np.ndarray | None:
    """The bin edges every histogram in ``rows`` was logged with, or None when they differ (the run store's
    histograms use fixed edges, ``dataflex_rl.metrics``, so they normally agree)."""
    first = np.asarray(rows["edges"].iloc[0], dtype=np.float64)
    for edges in rows["edges"]:
        if len(edges) != len(first) or not np.allclose(edges, first, rtol=0.0, atol=1e-12):
            return None
    return first


def _target_edges(rows: pd.DataFrame, bins: int | None, edges: np.ndarray | None) -> np.ndarray:
    """Explicit ``edges``; else the logged edges (``bins`` None) when shared; else ``bins`` (default 50) equal bins."""
    if edges is not None:
        return np.asarray(edges, dtype=np.float64)
    logged = shared_edges(rows) if bins is None else None
    return logged if logged is not None else _common_edges(rows, bins or 50)


def _counts_on(run_edges: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """A run's counts on ``edges``: as logged when its edges are these, else rebinned (:func:`rebin_histogram`)."""
    if len(run_edges) == len(edges) and np.allclose(run_edges, edges, rtol=0.0, atol=1e-12):
        return np.asarray(counts, dtype=np.float64)
    return rebin_histogram(run_edges, counts, edges)


def histogram_matrix(
    histograms: pd.DataFrame, name: str, bins: int | None = None, edges: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Histograms ``name`` of the given rows -> ``(steps (s,), edges (k+1,), fractions (s, k))``.

    Bins: ``edges`` if given; else the edges the histograms were logged with (``bins=None``, when they all share
    them: no rebinning, so a spike sits in exactly one bin); else ``bins`` equal bins spanning all edges. Each
    (run, step) histogram becomes fractions (rows sum to 1), averaged over runs at each step.
    """
    rows = histograms[histograms["name"].astype(str) == name]
    if rows.empty:
        raise KeyError(f"histogram name={name!r} is not in the table; available: "
                       f"{sorted(histograms['name'].astype(str).unique())}")
    edges = _target_edges(rows, bins, edges)
    steps = np.sort(rows["step"].unique())
    index = {int(step): i for i, step in enumerate(steps)}
    totals = np.zeros((steps.size, edges.size - 1))
    runs_per_step = np.zeros(steps.size)
    for step, run_edges, counts in zip(rows["step"], rows["edges"], rows["counts"], strict=True):
        on_edges = _counts_on(run_edges, counts, edges)
        mass = on_edges.sum()
        if mass > 0:
            totals[index[int(step)]] += on_edges / mass
            runs_per_step[index[int(step)]] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        fractions = totals / runs_per_step[:, None]
    return steps, edges, fractions


def occupied_range(edges: np.ndarray, fractions: np.ndarray, margin: int = 1) -> tuple[float, float]:
    """``(low, high)`` value range of the bins holding any mass in ``fractions`` ``(s, k)``, ``margin`` empty bins
    added on each side (the heatmap's y-axis is cropped to it); the full range when nothing is occupied."""
    occupied = np.flatnonzero(np.nansum(np.asarray(fractions), axis=0) > 0)
    if occupied.size == 0:
        return float(edges[0]), float(edges[-1])
    first = max(int(occupied[0]) - margin, 0)
    last = min(int(occupied[-1]) + 1 + margin, edges.size - 1)
    return float(edges[first]), float(edges[last])


def plot_histogram_heatmap(
    histograms: pd.DataFrame,
    name: str,
    *,
    ax: Axes | None = None,
    bins: int | None = None,
    vmax: float | None = None,
    colorbar: bool = True,
    edges: np.ndarray | None = None,
    crop: bool = True,
) -> Axes:
    """Heatmap of histogram ``name`` over training (x step, y value, colour = fraction of tokens), averaged over
    the runs in ``histograms`` (filter it to one group first). Bins as in :func:`histogram_matrix` (default: the
    logged edges). ``crop``: the y-axis spans only the occupied bins (:func:`occupied_range`). The mesh is
    ``ax.collections[0]``."""
    ax = _axes(ax)
    steps, edges, fractions = histogram_matrix(histograms, name, bins, edges)
    step_edges = _cell_edges(steps.astype(np.float64))
    # A square-root colour scale keeps spread-out distributions visible beside a single spike (alpha = 0: all 1).
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=vmax)
    mesh = ax.pcolormesh(step_edges, edges, fractions.T, shading="flat", cmap="magma", norm=norm)
    if crop:
        ax.set_ylim(*occupied_range(edges, fractions))
    if colorbar:
        ax.figure.colorbar(mesh, ax=ax, label="share of tokens (sqrt scale)")
    ax.set_xlabel(STEP_LABEL)
    ax.set_ylabel(metric_label(name))
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
    bins: int | None = None,
    crop: bool = True,
) -> np.ndarray:
    """One :func:`plot_histogram_heatmap` per group on a shared colour scale (one colour bar) and a shared y-range
    (cropped to the bins any group occupies); returns the axes ``(n_groups,)``."""
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
    edges = _target_edges(rows, bins, None)
    matrices = [histogram_matrix(_rows_of(rows, group_keys, g), name, edges=edges)[2] for g in groups]
    with np.errstate(invalid="ignore"):
        vmax = max(float(np.nanmax(m, initial=0.0)) for m in matrices) or None
    for ax, group in zip(axes, groups, strict=True):
        plot_histogram_heatmap(_rows_of(rows, group_keys, group), name, ax=ax, vmax=vmax, colorbar=False,
                               edges=edges, crop=False)
        ax.set_title(group_label(group_keys, group))
    if crop:
        low, high = occupied_range(edges, np.vstack(matrices))
        for ax in axes:
            ax.set_ylim(low, high)
    axes = np.asarray(axes)
    axes[0].figure.colorbar(axes[-1].collections[0], ax=list(axes), label="share of tokens (sqrt scale)")
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
    bins: int | None = None,
    log: bool = True,
) -> Axes:
    """Histogram ``name`` at ``step`` (default: each group's last logged step), mean count per run, one outline per
    group overlaid (e.g. the token-probability distribution at the end of training). Bins as in
    :func:`histogram_matrix` (default: the logged edges). ``log``: a log count axis, so a spike at 1 does not hide
    the low-probability tail."""
    ax = _axes(ax)
    rows = histograms[histograms["name"].astype(str) == name]
    if rows.empty:
        raise KeyError(f"histogram name={name!r} is not in the table; available: "
                       f"{sorted(histograms['name'].astype(str).unique())}")
    groups = _sorted_groups(rows, group_keys)
    colors = group_colors(groups)
    edges = _target_edges(rows, bins, None)
    steps_shown = set()
    for group in groups:
        part = _rows_of(rows, group_keys, group)
        chosen = int(part["step"].max()) if step is None else step
        part = part[part["step"] == chosen]
        if part.empty:
            continue
        steps_shown.add(chosen)
        counts = sum(_counts_on(e, c, edges) for e, c in zip(part["edges"], part["counts"], strict=True))
        ax.stairs(counts / len(part), edges, color=colors[group], linewidth=1.6,
                  label=f"{group_label(group_keys, group)} (step {chosen})")
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(metric_label(name))
    ax.set_ylabel("tokens per run" + (" (log scale)" if log else ""))
    when = f"step {steps_shown.pop()}" if len(steps_shown) == 1 else "each group's last step"
    ax.set_title(f"{metric_label(name)} at {when}", fontsize="medium")
    ax.grid(alpha=0.3, linewidth=0.5, which="major")
    ax.legend(fontsize="small")
    return ax


# --- gradient statistics by token probability -------------------------------------------------------------------


def grad_bucket_metrics(metric_names: Collection[str], stat: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every ``grad_norm/by_prob/<low>-<high>/<stat>`` key, sorted by ``low``."""
    return _bucket_metrics(GRAD_BUCKET_PATTERN, metric_names, stat=stat)


def _bucket_metrics(pattern: re.Pattern[str], metric_names: Collection[str],
                    **wanted: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every name ``pattern`` matches with the ``wanted`` groups, sorted by ``low``."""
    found = []
    for name in metric_names:
        match = pattern.match(str(name))
        if match and all(match[group] == value for group, value in wanted.items()):
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
    _bucket_bars(ax, long, buckets, value=value, group_keys=group_keys, final_window=final_window,
                 confidence=confidence, n_bootstrap=n_bootstrap, random_state=random_state)
    ax.set_ylabel(GRAD_STAT_LABELS.get(stat, stat))
    ax.set_title(f"{GRAD_STAT_LABELS.get(stat, stat)} by token probability\n"
                 f"({_summary_text(value, final_window)}, mean over seeds, {confidence:.0%} CI)", fontsize="medium")
    return ax


def _summary_text(value: str, final_window: int) -> str:
    return {"auc": "time-averaged over training", "final_window": f"mean of the last {final_window} steps"}.get(
        value, value)


def _bucket_bars(ax: Axes, long: pd.DataFrame, buckets: Sequence[tuple[str, float, float]], *, value: str,
                 group_keys: Sequence[str], final_window: int, confidence: float, n_bootstrap: int,
                 random_state: RandomState) -> None:
    """One bar per ``(metric, low, high)`` bucket and group: the per-run summary ``value`` of the bucket's metric,
    mean over seeds with its interval as error bars (:func:`analysis.aggregate.aggregate_runs`)."""
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
               yerr=np.clip(np.nan_to_num(np.vstack([center - low, high - center])), 0.0, None), capsize=2,
               label=group_label(group_keys, group))
    ax.set_xticks(positions, [f"[{b[1]:.2f}, {b[2]:.2f})" for b in buckets])
    ax.set_xlabel("token probability \u03c0 bucket (before the update)")
    ax.grid(axis="y", alpha=0.3, linewidth=0.5)
    ax.legend(fontsize="small")


def prob_change_metrics(metric_names: Collection[str], sign: str, stat: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every ``prob_change/<sign>/<low>-<high>/<stat>`` key, sorted by ``low``."""
    return _bucket_metrics(PROB_CHANGE_PATTERN, metric_names, sign=sign, stat=stat)


def plot_prob_change(
    long: pd.DataFrame,
    *,
    stat: str = "correct_share",
    value: str = "auc",
    group_keys: Sequence[str] = ("alpha",),
    final_window: int = DEFAULT_FINAL_WINDOW,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = 2000,
    random_state: RandomState = 0,
    axes: Sequence[Axes] | None = None,
) -> np.ndarray:
    """How one update moved each token's probability (the AR paper's Fig. 2): bars of
    ``prob_change/<sign>/<bucket>/<stat>`` per old-probability bucket, one series per group, with intervals over
    seeds; left the tokens with a positive advantage, right those with a negative one. ``stat``: ``correct_share``
    (the share that moved in the direction of its advantage) or ``mean_delta``. Returns the two axes."""
    names = long["metric"].unique()
    if not prob_change_metrics(names, "pos", stat) and not prob_change_metrics(names, "neg", stat):
        raise KeyError(f"no '{keys.PROB_CHANGE_PREFIX}/<sign>/<low>-<high>/{stat}' metric in the table")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11.0, 4.2), sharey=True)
    for ax, sign in zip(axes, keys.ADVANTAGE_SIGNS, strict=True):
        buckets = prob_change_metrics(names, sign, stat)
        if buckets:
            _bucket_bars(ax, long, buckets, value=value, group_keys=group_keys, final_window=final_window,
                         confidence=confidence, n_bootstrap=n_bootstrap, random_state=random_state)
        # the reference: half the tokens moving each way (correct_share), or no change (mean_delta)
        ax.axhline(0.5 if stat == "correct_share" else 0.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_title(f"{ADVANTAGE_SIGN_LABELS[sign]}\n({_summary_text(value, final_window)}, mean over seeds, "
                     f"{confidence:.0%} CI)", fontsize="medium")
    axes[0].set_ylabel(PROB_CHANGE_LABELS.get(stat, stat))
    return np.asarray(axes)


def available_grad_stats(metric_names: Collection[str], stats: Sequence[str] = GRAD_BUCKET_STATS) -> list[str]:
    """Those of ``stats`` (default :data:`GRAD_BUCKET_STATS`) with at least one bucket among ``metric_names``."""
    return [stat for stat in stats if grad_bucket_metrics(metric_names, stat)]


def close(ax_or_axes: Axes | np.ndarray | Mapping[str, Axes]) -> None:
    """Close the figure(s) behind axes made with ``ax=None`` (pyplot keeps them alive until closed)."""
    items = ax_or_axes.values() if isinstance(ax_or_axes, Mapping) else np.atleast_1d(ax_or_axes).ravel()
    for ax in items:
        plt.close(ax.figure)
