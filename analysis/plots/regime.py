"""A regime map: the delta against the baseline over two factors of a sweep, one cell per pair of their values, each
with its interval, and the cells whose interval excludes 0 framed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import TwoSlopeNorm
from matplotlib.patches import Rectangle

from analysis.plots.style import metric_label, value_text
from analysis.tables import mde_text

CELL_COLUMNS = ("mean_difference", "ci_low", "ci_high", "n_pairs", "mde")
DARK_SHARE = 0.6  # a cell whose |delta| exceeds this share of the colour scale's limit is written in white


def regime_cells(differences: pd.DataFrame, rows: str, columns: str, *, metric: str,
                 where: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per (``rows``, ``columns``) cell of :func:`analysis.aggregate.paired_differences`' table for ``metric``
    (its ``group_keys`` hold both factors; ``where`` picks one value of each other key, e.g. ``{"alpha": 0.5}``), with
    :data:`CELL_COLUMNS` and ``excludes_zero``: whether the cell's interval lies wholly on one side of 0."""
    missing = [key for key in (rows, columns, *(where or {}), *CELL_COLUMNS) if key not in differences.columns]
    if missing:
        raise ValueError(f"the differences table has no column {missing[0]!r}; its columns: "
                         f"{', '.join(map(str, differences.columns))}")
    selected = differences[differences["metric"].astype(str) == metric]
    for key, value in (where or {}).items():
        selected = selected[selected[key] == value]
    if selected.empty:
        raise ValueError(f"no cell of metric {metric!r} with {dict(where or {})}; metrics: "
                         f"{', '.join(sorted(differences['metric'].astype(str).unique()))}")
    if selected.duplicated([rows, columns]).any():
        others = [key for key in differences.columns if key not in (rows, columns, "metric", *CELL_COLUMNS)]
        raise ValueError(f"several cells per ({rows}, {columns}): pick one value of the other factors with "
                         f"where= (columns: {', '.join(map(str, others))})")
    cells = selected[[rows, columns, *CELL_COLUMNS]].sort_values([rows, columns]).reset_index(drop=True)
    cells["excludes_zero"] = (cells["ci_low"] > 0) | (cells["ci_high"] < 0)
    return cells


def plot_regime_map(differences: pd.DataFrame, rows: str, columns: str, *, metric: str,
                    where: Mapping[str, Any] | None = None, collapse: pd.DataFrame | None = None,
                    ax: Axes | None = None) -> Axes:
    """:func:`regime_cells` as a heatmap: colour the mean difference (0 white), write it with its interval, the number
    of paired seeds and the MDE, and frame the cells whose interval excludes 0; a cell with no pair of runs stays
    blank. ``collapse``: :func:`analysis.collapse.collapse_table`'s rows; each cell then also shows the arm's and the
    baseline's collapses out of their runs (``where``'s arm first)."""
    cells = regime_cells(differences, rows, columns, metric=metric, where=where)
    row_values, column_values = sorted(cells[rows].unique()), sorted(cells[columns].unique())
    grid = cells.pivot(index=rows, columns=columns, values="mean_difference").reindex(
        index=row_values, columns=column_values).to_numpy(dtype=float)
    if ax is None:
        ax = plt.subplots(figsize=(1.6 * len(column_values) + 2.5, 0.9 * len(row_values) + 1.8))[1]
    limit = float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0
    for cell in cells.to_dict("records"):
        i, j = row_values.index(cell[rows]), column_values.index(cell[columns])
        if np.isfinite(cell["mean_difference"]):
            dark = abs(cell["mean_difference"]) > DARK_SHARE * limit  # white text where the colour is deep
            ax.text(j, i, f"{cell['mean_difference']:+.3f}\n[{cell['ci_low']:+.3f}, {cell['ci_high']:+.3f}]\n"
                          f"n = {int(cell['n_pairs'])}, {mde_text(cell['mde'])}"
                          + collapse_text(collapse, {rows: cell[rows], columns: cell[columns]}, where),
                    ha="center", va="center", fontsize=8, color="white" if dark else "black",
                    fontweight="bold" if cell["excludes_zero"] else "normal")
        if cell["excludes_zero"]:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.5))
    image = ax.imshow(grid, cmap="RdBu", norm=TwoSlopeNorm(0.0, -limit or -1.0, limit or 1.0), aspect="auto")
    ax.figure.colorbar(image, ax=ax, label=f"\u0394 {metric_label(metric)} vs the baseline")
    ax.set_xticks(range(len(column_values)), [value_text(value) for value in column_values])
    ax.set_yticks(range(len(row_values)), [value_text(value) for value in row_values])
    ax.set_xlabel(columns)
    ax.set_ylabel(rows)
    chosen = ", ".join(f"{key} = {value}" for key, value in (where or {}).items())
    ax.set_title(f"{metric_label(metric)}{f' ({chosen})' if chosen else ''}: framed cells' intervals exclude 0")
    return ax


def collapse_text(collapse: pd.DataFrame | None, cell: Mapping[str, Any], where: Mapping[str, Any] | None) -> str:
    """``\\ncollapsed 3/10 vs 1/10``: the cell's arm (``where``) and the other group at the same cell."""
    if collapse is None or collapse.empty:
        return ""
    rows = collapse
    for key, value in cell.items():
        rows = rows[np.isclose(rows[key].astype(float), float(value))]
    arm = rows
    for key, value in (where or {}).items():
        arm = arm[arm[key] == value]
    others = rows.drop(arm.index)
    if len(arm) != 1 or len(others) != 1:
        return ""
    return (f"\ncollapsed {int(arm['collapsed'].iloc[0])}/{int(arm['runs'].iloc[0])} vs "
            f"{int(others['collapsed'].iloc[0])}/{int(others['runs'].iloc[0])}")
