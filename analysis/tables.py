"""Comparison tables (one row per group, ``mean ± half-width (n)`` cells, paired deltas, bold where the paired
interval excludes 0) as Markdown, LaTeX, HTML and CSV."""

from __future__ import annotations

import itertools
import os
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.groups import check_columns, group_key
from analysis.statistics import MIN_SEEDS_FOR_INTERVAL

TableStyle = Literal["pm", "interval"]
TABLE_STYLES: tuple[str, ...] = ("pm", "interval")
TABLE_FORMATS: tuple[str, ...] = ("md", "csv", "tex", "html")
DELTA_PREFIX = "Δ "


@dataclass(frozen=True)
class ComparisonTable:
    """``cells``: text without markup, group keys first; ``best``: where a cell is bold; ``numbers``: tidy numbers."""

    cells: pd.DataFrame
    best: pd.DataFrame
    numbers: pd.DataFrame
    caption: str = ""


def _format_cell(row: pd.Series | None, statistic: str, style: TableStyle, digits: int) -> str:
    """An aggregate row's ``statistic`` with its interval and n; ``n/a`` for a group without the metric."""
    if row is None or not row["n"] or not np.isfinite(float(row[statistic])):
        return "n/a"
    low_column, high_column = ("ci_low", "ci_high") if statistic == "mean" else ("iqm_ci_low", "iqm_ci_high")
    mean, low, high, n = float(row[statistic]), float(row[low_column]), float(row[high_column]), int(row["n"])
    if n < MIN_SEEDS_FOR_INTERVAL or not (np.isfinite(low) and np.isfinite(high)):
        return f"{mean:.{digits}f} ({n}, too few seeds)" if n < MIN_SEEDS_FOR_INTERVAL else f"{mean:.{digits}f} ({n})"
    if style == "pm":
        return f"{mean:.{digits}f} ± {(high - low) / 2:.{digits}f} ({n})"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}] ({n})"


def _format_p(value: float) -> str:
    return "p<0.001" if value < 0.001 else f"p={value:.3f}" if value < 0.01 else f"p={value:.2f}"


def _format_delta(row: pd.Series, digits: int, multiple: bool) -> str:
    """``+diff [low, high] p=.. (Holm ..) MDE ..``."""
    if row["n_pairs"] == 0 or not np.isfinite(row["mean_difference"]):
        return "n/a (no common seed)"
    text = f"{row['mean_difference']:+.{digits}f}"
    if row["n_pairs"] < MIN_SEEDS_FOR_INTERVAL or not np.isfinite(row["ci_low"]):
        return f"{text} ({int(row['n_pairs'])} seeds, too few seeds)"
    text += f" [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}]"
    if "p_value" in row and np.isfinite(row["p_value"]):
        text += " " + _format_p(row["p_value"])
        if multiple and "p_holm" in row and np.isfinite(row["p_holm"]):
            text += f" (Holm {_format_p(row['p_holm'])})"
    if "mde" in row and np.isfinite(row["mde"]):
        text += " " + mde_text(row["mde"], digits)
    return text


def mde_text(mde: float, digits: int = 3) -> str:
    """``MDE x``; ``no spread`` when every pair differed by the same amount (an MDE of 0 would claim any difference
    detectable, where the seeds only show no variation to measure one against)."""
    return "no spread" if mde == 0 else f"MDE {mde:.{digits}f}"


def significant(row: pd.Series) -> bool:
    """Bold rule: at least MIN_SEEDS_FOR_INTERVAL pairs and a paired interval that excludes 0."""
    return bool(row["n_pairs"] >= MIN_SEEDS_FOR_INTERVAL and np.isfinite(row["ci_low"]) and np.isfinite(row["ci_high"])
                and (row["ci_low"] > 0 or row["ci_high"] < 0))


def comparison_table(aggregates: pd.DataFrame, *, deltas: pd.DataFrame | None = None,
                     metrics: Sequence[str] | None = None, group_keys: Sequence[str] = ("alpha",),
                     statistic: Literal["mean", "iqm"] = "mean", style: TableStyle = "pm", digits: int = 3,
                     caption: str = "") -> ComparisonTable:
    """The table of :func:`~analysis.aggregate.aggregate_runs` (and ``deltas`` of ``paired_differences``) output;
    ``statistic``: ``mean`` (Student-t interval) or ``iqm`` (BCa interval); ``metrics``: the columns, in order."""
    for name, value, allowed in (("style", style, TABLE_STYLES), ("statistic", statistic, ("mean", "iqm"))):
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {allowed}")
    check_columns(aggregates, [*group_keys, "metric"], "group_keys")
    present = list(dict.fromkeys(aggregates["metric"].astype(str)))
    metrics = list(metrics) if metrics is not None else present
    unknown = [m for m in metrics if m not in present]
    if unknown:
        raise KeyError(f"metrics {unknown} are not in the aggregates; available: {present}")
    groups = aggregates[list(group_keys)].drop_duplicates().sort_values(list(group_keys)).reset_index(drop=True)
    identities = [group_key(row) for row in groups.itertuples(index=False)]
    cells = pd.DataFrame({key: [f"{value:g}" if isinstance(value, float) else str(value) for value in groups[key]]
                          for key in group_keys})
    best = pd.DataFrame(False, index=cells.index, columns=cells.columns)
    for metric in metrics:
        by_group = _rows_by_group(aggregates, metric, group_keys)
        cells[metric] = [_format_cell(by_group.get(key), statistic, style, digits) for key in identities]
        best[metric] = False
        delta_rows = _rows_by_group(deltas, metric, group_keys) if deltas is not None and len(deltas) else {}
        if delta_rows:  # paired_differences has a row for every group but the baseline
            delta_column = DELTA_PREFIX + metric
            multiple = len(delta_rows) > 1
            cells[delta_column] = [
                _format_delta(delta_rows[key], digits, multiple) if key in delta_rows else "baseline"
                for key in identities]
            best[delta_column] = [key in delta_rows and significant(delta_rows[key]) for key in identities]
    return ComparisonTable(cells=cells, best=best, numbers=_table_numbers(aggregates, deltas, metrics, group_keys),
                           caption=caption)


def _rows_by_group(frame: pd.DataFrame, metric: str, group_keys: Sequence[str]) -> dict[tuple[Any, ...], pd.Series]:
    """``frame``'s rows of ``metric`` by their :func:`~analysis.groups.group_key`."""
    rows = frame[frame["metric"].astype(str) == metric]
    return {group_key(row[list(group_keys)]): row for _, row in rows.iterrows()}


def _table_numbers(aggregates: pd.DataFrame, deltas: pd.DataFrame | None, metrics: Sequence[str],
                   group_keys: Sequence[str]) -> pd.DataFrame:
    """The aggregates joined with the deltas (their interval as ``difference_ci_*``)."""
    numbers = aggregates[aggregates["metric"].astype(str).isin(metrics)]
    if deltas is not None and len(deltas):
        renamed = deltas.rename(columns={"ci_low": "difference_ci_low", "ci_high": "difference_ci_high"}).drop(
            columns=["mean"], errors="ignore")
        joined_keys = [*group_keys, "metric"]
        numbers = numbers.merge(renamed.astype({k: numbers[k].dtype for k in joined_keys if k in numbers}),
                                on=joined_keys, how="left")
    return numbers.reset_index(drop=True)


def frame_markdown(frame: pd.DataFrame, float_format: str = "g") -> str:
    """A plain table as GitHub Markdown, floats in ``float_format`` (``%g`` form by default)."""
    floats = [column for column in frame.columns if pd.api.types.is_float_dtype(frame[column].dtype)]
    # disable_numparse: tabulate would read "0.480" back as a number and print 0.48
    return frame.assign(**{column: [format(v, float_format) for v in frame[column]] for column in floats}
                        ).to_markdown(index=False, disable_numparse=float_format != "g")


def _marked(cells: pd.DataFrame, best: pd.DataFrame, bold: Callable[[str], str]) -> pd.DataFrame:
    """``cells`` as text, the best ones through ``bold``: each format's markup of the one bold rule."""
    text = cells.astype(str)
    return text.where(~best.to_numpy(dtype=bool), text.map(bold))


def to_markdown(table: ComparisonTable) -> str:
    """GitHub Markdown (best cells in ``**bold**``)."""
    return _marked(table.cells, table.best, "**{}**".format).to_markdown(index=False)


LATEX_MAX_WIDTH = 46  # characters of cell text per tabular: one column of a two-column 10pt paper at \small
LATEX_HEADER_LINE = 18  # header text wraps into lines of at most this many characters
_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_SYMBOLS = {"±": r"$\pm$", "Δ": r"$\Delta$", "π": r"$\pi$", "α": r"$\alpha$"}
_NUMERIC_CELL = re.compile(r"^[-+]?(\d|\.\d|nan$|n/a|baseline$|inf)")


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped and ±, Δ, π, α as math symbols."""
    escaped = "".join(_LATEX_SPECIAL.get(char, char) for char in str(text))
    for symbol, command in _LATEX_SYMBOLS.items():
        escaped = escaped.replace(symbol, command)
    return escaped


def _key_columns(table: ComparisonTable) -> list[str]:
    """The leading columns that are also columns of the numbers: the group keys."""
    return list(itertools.takewhile(lambda c: c != "metric" and c in table.numbers.columns, table.cells.columns))


def _header_lines(text: str, width: int = LATEX_HEADER_LINE) -> list[str]:
    return textwrap.wrap(str(text), width, break_long_words=False, break_on_hyphens=False) or [""]


def _column_width(table: ComparisonTable, column: str) -> int:
    header = max(len(line) for line in _header_lines(column))
    cells = max((len(str(text)) for text in table.cells[column]), default=0)
    return max(header, cells) + 2


def latex_column_groups(table: ComparisonTable, max_width: int = LATEX_MAX_WIDTH) -> list[list[str]]:
    """The value columns in groups that fit ``max_width`` characters beside the group keys, one ``tabular`` each."""
    keys = _key_columns(table)
    budget = max_width - sum(_column_width(table, key) for key in keys)
    groups: list[list[str]] = []
    used = 0
    for column in [c for c in table.cells.columns if c not in keys]:
        width = _column_width(table, column)
        if groups and used + width <= budget:
            groups[-1].append(column)
            used += width
        else:
            groups.append([column])
            used = width
    return groups or [[]]


def _latex_tabular(table: ComparisonTable, columns: Sequence[str]) -> list[str]:
    cells = table.cells[list(columns)]
    numeric = [all(_NUMERIC_CELL.match(str(text)) for text in cells[column]) for column in columns]
    align = "".join("r" if flag else "l" for flag in numeric)

    def header(column: str, flag: bool) -> str:
        lines = [latex_escape(line) for line in _header_lines(column)]
        if len(lines) == 1:
            return lines[0]
        side = "r" if flag else "l"
        return rf"\begin{{tabular}}[b]{{@{{}}{side}@{{}}}}" + r" \\ ".join(lines) + r"\end{tabular}"

    lines = [rf"\begin{{tabular}}{{{align}}}", r"\toprule",
             " & ".join(header(c, f) for c, f in zip(columns, numeric, strict=True)) + r" \\", r"\midrule"]
    marked = _marked(cells.map(latex_escape), table.best[list(columns)], r"\bfseries {}".format)
    lines += [" & ".join(row) + r" \\" for row in marked.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return lines


def to_latex(table: ComparisonTable, max_width: int = LATEX_MAX_WIDTH) -> str:
    """A LaTeX ``booktabs`` table for one paper column, split into stacked blocks (:func:`latex_column_groups`)."""
    keys = _key_columns(table)
    lines = [r"% needs \usepackage{booktabs}", r"\begin{table}[tbp]", r"\centering", r"\small",
             r"\setlength{\tabcolsep}{4pt}"]
    if table.caption:
        lines.append(rf"\caption{{{latex_escape(table.caption)}}}")
    for index, group in enumerate(latex_column_groups(table, max_width)):
        if index:
            lines += [r"", r"\medskip"]
        lines += _latex_tabular(table, [*keys, *group])
    lines.append(r"\end{table}")
    return "\n".join(lines)


HTML_STYLE = """
table.dataflex { border-collapse: collapse; font-family: system-ui, sans-serif; font-size: 14px; margin: 1em 0; }
table.dataflex caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.4em; }
table.dataflex th { border-bottom: 2px solid #333; padding: 4px 10px; text-align: right; vertical-align: bottom; }
table.dataflex td { padding: 3px 10px; text-align: right; white-space: nowrap;
                    font-variant-numeric: tabular-nums; border-bottom: 1px solid #ddd; }
table.dataflex tr:last-child td { border-bottom: 2px solid #333; }
"""


def to_html(table: ComparisonTable) -> str:
    """HTML table (best cells bold, numbers unwrapped and right-aligned) with its ``<style>``."""
    styler = table.cells.style.hide(axis="index").apply(
        lambda _: np.where(table.best.to_numpy(), "font-weight: bold;", ""), axis=None
    ).set_table_attributes('class="dataflex"')
    if table.caption:
        styler = styler.set_caption(table.caption)
    return f"<style>{HTML_STYLE}</style>\n" + styler.to_html()


def to_rich(table: ComparisonTable) -> Any:
    """A :class:`rich.table.Table` with the same cells, for terminals."""
    from rich.table import Table

    rendered = Table(title=table.caption or None, title_justify="left")
    for column in table.cells.columns:
        # a cell is never narrower than its longest value (no number broken over two lines); headers may wrap
        widest = max((len(str(text)) for text in table.cells[column]), default=1)
        rendered.add_column(str(column), justify="right", min_width=widest)
    for row in _marked(table.cells, table.best, "[bold]{}[/bold]".format).itertuples(index=False):
        rendered.add_row(*row)
    return rendered


def write_table(table: ComparisonTable, out_dir: str | os.PathLike[str], stem: str,
                formats: Sequence[str] = TABLE_FORMATS) -> dict[str, Path]:
    """Write ``<stem>.<format>`` for each of ``formats``; return the paths."""
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
            path.write_text({"md": to_markdown, "tex": to_latex, "html": to_html}[fmt](table) + "\n")
        written[fmt] = path
    return written
