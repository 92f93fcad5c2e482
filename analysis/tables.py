"""Comparison tables: one row per group (alpha, or mechanism configuration and alpha), one column per metric.

A cell reads ``mean ± half-width (n)`` (style ``pm``; half-width = half the bootstrap CI) or ``mean [low, high] (n)``
(style ``interval``); the best group of each metric with a direction is marked (bold); a ``Δ <metric>`` column gives the paired
difference against the baseline as ``+diff [low, high] P=p`` (``P`` = probability of improvement). Writers: Markdown
(``pandas.to_markdown``, which needs ``tabulate``), LaTeX and HTML (pandas Styler, which needs ``jinja2``) and CSV (the
numbers behind the table in tidy form: one row per group and metric).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.aggregate import metric_direction

TableStyle = Literal["pm", "interval"]
TABLE_STYLES: tuple[str, ...] = ("pm", "interval")
TABLE_FORMATS: tuple[str, ...] = ("md", "csv", "tex", "html")
DELTA_PREFIX = "Δ "


@dataclass(frozen=True)
class ComparisonTable:
    """``cells`` ``(n_groups, n_keys + n_columns)`` text without markup (group-key columns first), ``best`` the same
    shape (True where a cell is its column's best), ``numbers`` the tidy numbers (one row per group and metric)."""

    cells: pd.DataFrame
    best: pd.DataFrame
    numbers: pd.DataFrame
    caption: str = ""


def _format_key(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:g}"
    return str(value)


def _format_cell(mean: float, low: float, high: float, n: int, style: TableStyle, digits: int) -> str:
    if not np.isfinite(mean):
        return "n/a"
    if style == "pm":
        return f"{mean:.{digits}f} ± {(high - low) / 2:.{digits}f} ({n})"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] ({n})"


def _format_delta(row: pd.Series, digits: int) -> str:
    if row["n_pairs"] == 0 or not np.isfinite(row["mean_difference"]):
        return "n/a (no common seed)"
    return (f"{row['mean_difference']:+.{digits}f} [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}] "
            f"P={row['prob_improvement']:.2f}")


def comparison_table(
    aggregates: pd.DataFrame,
    *,
    deltas: pd.DataFrame | None = None,
    metrics: Sequence[str] | None = None,
    group_keys: Sequence[str] = ("alpha",),
    statistic: Literal["mean", "iqm"] = "mean",
    style: TableStyle = "pm",
    digits: int = 3,
    minimize: Collection[str] | None = None,
    maximize: Collection[str] | None = None,
    caption: str = "",
) -> ComparisonTable:
    """Build the table from :func:`analysis.aggregate.aggregate_runs` output (and optionally
    :func:`analysis.aggregate.paired_differences` output as ``deltas``).

    ``statistic``: ``mean`` (CI of the mean) or ``iqm`` (CI of the IQM). ``metrics``: the columns, in order (default:
    every metric of ``aggregates``). Baseline rows get ``baseline`` in their delta cells. The best group is marked only
    for metrics with a direction (:func:`analysis.aggregate.metric_direction`, overridden by ``minimize`` /
    ``maximize``): none for e.g. ``response_length/mean``.
    """
    if style not in TABLE_STYLES:
        raise ValueError(f"style={style!r} is not one of {TABLE_STYLES}")
    if statistic not in ("mean", "iqm"):
        raise ValueError(f"statistic={statistic!r} is not one of ('mean', 'iqm')")
    missing = [k for k in (*group_keys, "metric") if k not in aggregates.columns]
    if missing:
        raise KeyError(f"aggregates lack columns {missing} (group_keys={list(group_keys)!r}); "
                       f"columns: {list(aggregates.columns)}")
    present = list(dict.fromkeys(aggregates["metric"].astype(str)))
    metrics = list(metrics) if metrics is not None else present
    unknown = [m for m in metrics if m not in present]
    if unknown:
        raise KeyError(f"metrics {unknown} are not in the aggregates; available: {present}")
    low_column, high_column = ("ci_low", "ci_high") if statistic == "mean" else ("iqm_ci_low", "iqm_ci_high")

    groups = aggregates[list(group_keys)].drop_duplicates().sort_values(list(group_keys)).reset_index(drop=True)
    group_labels = [tuple(_format_key(v) for v in row) for row in groups.itertuples(index=False)]
    cells = pd.DataFrame({key: [label[i] for label in group_labels] for i, key in enumerate(group_keys)})
    best = pd.DataFrame(False, index=cells.index, columns=cells.columns)

    def lookup(frame: pd.DataFrame, metric: str) -> dict[tuple[str, ...], pd.Series]:
        rows = frame[frame["metric"].astype(str) == metric]
        return {tuple(_format_key(v) for v in row[list(group_keys)]): row for _, row in rows.iterrows()}

    for metric in metrics:
        by_group = lookup(aggregates, metric)
        column, means = [], []
        for label in group_labels:
            row = by_group.get(label)
            if row is None or not row["n"]:
                column.append("n/a")
                means.append(np.nan)
                continue
            center = float(row[statistic])
            column.append(_format_cell(center, float(row[low_column]), float(row[high_column]), int(row["n"]),
                                       style, digits))
            means.append(center)
        cells[metric] = column
        means_array = np.array(means, dtype=np.float64)
        best[metric] = False
        direction = metric_direction(metric, minimize, maximize)
        if direction and np.isfinite(means_array).sum() > 1:
            target = np.nanmin(means_array) if direction < 0 else np.nanmax(means_array)
            best[metric] = np.isclose(means_array, target, rtol=0.0, atol=0.5 * 10.0 ** -digits)
        delta_rows = lookup(deltas, metric) if deltas is not None and len(deltas) else {}
        if delta_rows:  # paired_differences has a row for every group but the baseline
            delta_column = DELTA_PREFIX + metric
            cells[delta_column] = [
                _format_delta(delta_rows[label], digits) if label in delta_rows else "baseline"
                for label in group_labels]
            best[delta_column] = False

    numbers = aggregates[aggregates["metric"].astype(str).isin(metrics)]
    if deltas is not None and len(deltas):
        renamed = deltas.rename(columns={"ci_low": "difference_ci_low", "ci_high": "difference_ci_high"}).drop(
            columns=["mean"], errors="ignore")
        joined_keys = [*group_keys, "metric"]
        numbers = numbers.merge(renamed.astype({k: numbers[k].dtype for k in joined_keys if k in numbers}),
                                on=joined_keys, how="left")
    return ComparisonTable(cells=cells, best=best, numbers=numbers.reset_index(drop=True), caption=caption)


def to_markdown(table: ComparisonTable) -> str:
    """GitHub Markdown (best cells in ``**bold**``); needs the ``tabulate`` package."""
    try:
        import tabulate  # noqa: F401 - pandas.to_markdown imports it; fail here with the fix in the message
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("Markdown tables need the 'tabulate' package: pip install tabulate") from exc
    marked = table.cells.copy()
    for column in marked.columns:
        marked[column] = [f"**{text}**" if flag else text for text, flag in zip(
            marked[column], table.best[column], strict=True)]
    return marked.to_markdown(index=False)


def _styler(table: ComparisonTable) -> pd.io.formats.style.Styler:
    def bold(frame: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(np.where(table.best.to_numpy(), "font-weight: bold;", ""), index=frame.index,
                            columns=frame.columns)

    return table.cells.style.hide(axis="index").apply(bold, axis=None)


def to_latex(table: ComparisonTable) -> str:
    """LaTeX ``tabular`` (booktabs rules, best cells ``\\bfseries``) through pandas Styler; needs ``\\usepackage{booktabs}``."""
    styler = _styler(table).format(escape="latex").format_index(escape="latex", axis=1)
    text = styler.to_latex(convert_css=True, hrules=True, caption=table.caption or None,
                           column_format="l" * table.cells.shape[1])
    return text.replace("±", r"$\pm$").replace("Δ", r"$\Delta$")


def to_html(table: ComparisonTable) -> str:
    """HTML table (best cells bold) through pandas Styler."""
    styler = _styler(table)
    if table.caption:
        styler = styler.set_caption(table.caption)
    return styler.to_html()


def to_rich(table: ComparisonTable) -> Any:
    """A :class:`rich.table.Table` with the same cells (best cells bold, numbers right-aligned), for terminals."""
    from rich.table import Table

    rendered = Table(title=table.caption or None, title_justify="left")
    for column in table.cells.columns:
        rendered.add_column(str(column), justify="right", no_wrap=True)
    for row in range(len(table.cells)):
        rendered.add_row(*[f"[bold]{text}[/bold]" if flag else str(text) for text, flag in zip(
            table.cells.iloc[row], table.best.iloc[row], strict=True)])
    return rendered


def write_table(
    table: ComparisonTable,
    out_dir: str | os.PathLike[str],
    stem: str,
    formats: Sequence[str] = TABLE_FORMATS,
) -> dict[str, Path]:
    """Write ``<stem>.<format>`` for each of ``formats`` (``md``, ``csv``, ``tex``, ``html``); return the paths."""
    unknown = [f for f in formats if f not in TABLE_FORMATS]
    if unknown:
        raise ValueError(f"formats {unknown} are not among {TABLE_FORMATS}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for fmt in formats:
        path = out_dir / f"{stem}.{fmt}"
        if fmt == "csv":
            table.numbers.to_csv(path, index=False)
        else:
            renderer = {"md": to_markdown, "tex": to_latex, "html": to_html}[fmt]
            path.write_text(renderer(table) + "\n")
        written[fmt] = path
    return written
