"""Distribution figures: per-token weight and probability histograms rebinned onto shared edges, as heatmaps over
steps or as one step's bars."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import PowerNorm

from analysis.groups import rows_of
from analysis.plots.style import (STEP_LABEL, axes_or_new, group_colors, group_label, group_rows, metric_label,
                                  sorted_groups)


def rebin_histogram(edges: np.ndarray, counts: np.ndarray, new_edges: np.ndarray) -> np.ndarray:
    """Counts on ``edges`` -> counts on ``new_edges``, assuming counts spread uniformly inside each bin."""
    cumulative = np.concatenate([[0.0], np.cumsum(np.asarray(counts, dtype=np.float64))])
    return np.diff(np.interp(new_edges, np.asarray(edges, dtype=np.float64), cumulative))


def _target_edges(rows: pd.DataFrame, bins: int | None, edges: np.ndarray | None) -> np.ndarray:
    """Explicit ``edges``; else the logged edges (``bins`` None) when shared; else ``bins`` (default 50) equal bins."""
    if edges is not None:
        return np.asarray(edges, dtype=np.float64)
    first = np.asarray(rows["edges"].iloc[0], dtype=np.float64)
    if bins is None and all(len(e) == len(first) and np.allclose(e, first, rtol=0.0, atol=1e-12)
                            for e in rows["edges"]):  # logged with shared edges
        return first
    low = min(float(np.min(e)) for e in rows["edges"])
    high = max(float(np.max(e)) for e in rows["edges"])
    return np.linspace(low, high if high > low else low + 1.0, (bins or 50) + 1)


def _counts_on(run_edges: np.ndarray, counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """A run's counts on ``edges``: as logged when its edges are these, else rebinned (:func:`rebin_histogram`)."""
    if len(run_edges) == len(edges) and np.allclose(run_edges, edges, rtol=0.0, atol=1e-12):
        return np.asarray(counts, dtype=np.float64)
    return rebin_histogram(run_edges, counts, edges)


def histogram_matrix(histograms: pd.DataFrame, name: str, bins: int | None = None,
                     edges: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Histograms ``name`` -> ``(steps, edges, fractions (s, k))``, each run's fractions averaged at each step.

    Bins: ``edges``; else the logged edges when shared (``bins=None``: a spike stays in one bin); else ``bins``."""
    rows = rows_of(histograms, "name", name)
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
    """Value range of the bins holding any mass, ``margin`` bins added on each side (all of it when none)."""
    occupied = np.flatnonzero(np.nansum(np.asarray(fractions), axis=0) > 0)
    if occupied.size == 0:
        return float(edges[0]), float(edges[-1])
    first = max(int(occupied[0]) - margin, 0)
    last = min(int(occupied[-1]) + 1 + margin, edges.size - 1)
    return float(edges[first]), float(edges[last])


def plot_histogram_heatmap(histograms: pd.DataFrame, name: str, *, ax: Axes | None = None, bins: int | None = None,
                           vmax: float | None = None, colorbar: bool = True, edges: np.ndarray | None = None,
                           crop: bool = True) -> Axes:
    """Heatmap of histogram ``name`` over steps, averaged over the runs given; the mesh is ``ax.collections[0]``."""
    ax = axes_or_new(ax)
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
    """Edges around cell centres: midpoints, with the end cells mirrored."""
    if centers.size == 1:
        return np.array([centers[0] - 0.5, centers[0] + 0.5])
    middle = (centers[1:] + centers[:-1]) / 2.0
    return np.concatenate([[2 * centers[0] - middle[0]], middle, [2 * centers[-1] - middle[-1]]])


def plot_histogram_heatmaps(histograms: pd.DataFrame, name: str, *, group_keys: Sequence[str] = ("alpha",),
                            axes: Sequence[Axes] | None = None, bins: int | None = None,
                            crop: bool = True) -> np.ndarray:
    """One :func:`plot_histogram_heatmap` per group on a shared colour scale and y-range; returns the axes."""
    rows = rows_of(histograms, "name", name)
    groups = sorted_groups(rows, group_keys)
    if axes is None:
        axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups) + 1.0, 3.5), squeeze=False, sharey=True,
                            layout="constrained")[1][0]
    if len(axes) != len(groups):
        raise ValueError(f"got {len(axes)} axes for {len(groups)} groups of {list(group_keys)}")
    edges = _target_edges(rows, bins, None)
    matrices = [histogram_matrix(group_rows(rows, group_keys, g), name, edges=edges)[2] for g in groups]
    with np.errstate(invalid="ignore"):
        vmax = max(float(np.nanmax(m, initial=0.0)) for m in matrices) or None
    for ax, group in zip(axes, groups, strict=True):
        plot_histogram_heatmap(group_rows(rows, group_keys, group), name, ax=ax, vmax=vmax, colorbar=False,
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


def plot_histogram(histograms: pd.DataFrame, name: str, *, step: int | None = None,
                   group_keys: Sequence[str] = ("alpha",), ax: Axes | None = None, bins: int | None = None,
                   log: bool = True) -> Axes:
    """Histogram ``name`` at ``step`` (default each group's last), mean count per run, one outline per group."""
    ax = axes_or_new(ax)
    rows = rows_of(histograms, "name", name)
    groups = sorted_groups(rows, group_keys)
    colors = group_colors(groups)
    edges = _target_edges(rows, bins, None)
    steps_shown = set()
    for group in groups:
        part = group_rows(rows, group_keys, group)
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
