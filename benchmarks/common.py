"""What every benchmark shares: interleaved timing rounds (every side warmed up, the sides taking turns in each
round so that machine noise hits them alike, min and median over the rounds) and the one table ``make bench`` prints."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: ``before`` and ``after`` as (min, median) in ``unit``."""

    benchmark: str
    measure: str
    unit: str
    before: tuple[float, float] | None
    after: tuple[float, float]
    ratio: float | None = None
    note: str = ""


def min_median(samples: list[float]) -> tuple[float, float]:
    return min(samples), statistics.median(samples)


def interleaved(sides: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in (names if index % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _cell(value: tuple[float, float] | None, unit: str) -> str:
    return "-" if value is None else f"{_number(value[0])} / {_number(value[1])} {unit}"


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_table(rows: list[Row]) -> str:
    """The markdown table: benchmark, what is measured, before and after as min / median, ratio, notes."""
    header = ["benchmark", "measure", "before (min / median)", "after (min / median)", "ratio", "note"]
    lines = [header, ["---"] * len(header)]
    for row in rows:
        ratio = row.ratio
        if ratio is None and row.before is not None and row.before[1]:
            ratio = row.after[1] / row.before[1]
        lines.append([row.benchmark, row.measure, _cell(row.before, row.unit), _cell(row.after, row.unit),
                      "-" if ratio is None else f"{ratio:.2f}x", row.note])
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
