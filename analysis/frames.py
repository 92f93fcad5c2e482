"""The tables every loader returns (run store, W&B online, W&B offline): column sets, :class:`SweepData`, and the
builders the loaders share (columns: docs/analysis.md, "The tables"). Reads no file, so every loader can import it.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dataflex_rl.tracking import run_store

IDENTITY_COLUMNS: tuple[str, ...] = ("sweep", "run", "backend", "mechanism", "mechanism_label", "alpha", "seed")
CATEGORY_COLUMNS: tuple[str, ...] = ("sweep", "run", "backend", "mechanism", "mechanism_label")
LONG_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS, "step", "metric", "value")
HISTOGRAM_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS, "step", "name", "edges", "counts")
RUN_COLUMNS: tuple[str, ...] = (
    *IDENTITY_COLUMNS, "state", "status_step", "error", "wall_time_s", "git_commit", "config_hash", "start_time",
    "end_time", "environment", "warm_start", "warm_start_design", "warm_start_seed",
    "warm_start_steps", "warm_start_target", "warm_start_check", "warm_start_reached", "path", "metrics_source",
    "included", "exclusion_reason", "nonfinite",
)


@dataclass(frozen=True)
class SweepData:
    """The run table, the long metrics table and the histogram table (docs/analysis.md, "The tables")."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    histograms: pd.DataFrame
    manifest: dict[str, Any] | None = None
    source: str = ""

    @property
    def included_runs(self) -> pd.DataFrame:
        """Run-table rows whose metrics are in :attr:`metrics`."""
        return self.runs[self.runs["included"]]

    @property
    def excluded_runs(self) -> pd.DataFrame:
        """Run-table rows left out of :attr:`metrics`, with ``state``, ``error`` and ``exclusion_reason``."""
        return self.runs[~self.runs["included"]]

    @property
    def metric_names(self) -> list[str]:
        """Metric keys present in :attr:`metrics` (sorted)."""
        return sorted(self.metrics["metric"].unique().tolist()) if len(self.metrics) else []


@dataclass(frozen=True)
class RunMetrics:
    """One run's metrics in wide form: ``steps`` ``(n,)`` int64 sorted unique, ``values`` ``(m, n)`` float64 (NaN
    where not logged); ``nonfinite``: the metrics logged as NaN or infinite, with those steps (their values are
    left out whole: a broken metric gives no final value from its earlier ones)."""

    steps: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray
    nonfinite: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def flatten_config(config: Mapping[str, Any], prefix: str = "config.") -> dict[str, Any]:
    """The run store's flattened config as ``{prefix + "a.b.c": value}`` columns, lists and mappings as JSON."""
    return {prefix + key: json.dumps(value, default=str) if isinstance(value, (list, tuple, Mapping)) else value
            for key, value in run_store.flatten_config(config).items()}


def as_float(value: Any) -> float:
    """``value`` as a float; NaN for None or anything that is not a number."""
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def as_seed(value: Any) -> int | None:
    """``value`` as an int (seeds, steps); None for None, NaN or anything that is not an integer."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def wide_metrics(by_step: Mapping[int, Mapping[str, Any]], metrics: Sequence[str] | None) -> RunMetrics:
    """``{step: {key: value}}`` history -> :class:`RunMetrics` of its numeric keys matching ``metrics`` (globs)."""
    steps = np.array(sorted(by_step), dtype=np.int64)
    numeric = {key for row in by_step.values() for key, value in row.items() if _is_number(value)}
    names = tuple(name for name in sorted(numeric) if metrics is None
                  or any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in metrics))
    index = {name: i for i, name in enumerate(names)}
    values = np.full((len(names), len(steps)), np.nan)
    for column, step in enumerate(steps):
        for key, value in by_step[int(step)].items():
            if key in index and _is_number(value):
                values[index[key], column] = float(value)
    return RunMetrics(steps, names, values)


def axis_factors(axes: Any) -> dict[str, Any]:
    """A run's recorded axes -> its factor columns (the axes the identity columns do not hold)."""
    if not isinstance(axes, Mapping):
        return {}
    return {str(name): value for name, value in axes.items() if name not in IDENTITY_COLUMNS}


def pop_factors(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Move each row's ``factors`` into columns of the row (in place); return their names in first-seen order."""
    factors = [row.pop("factors", None) or {} for row in rows]
    for row, row_factors in zip(rows, factors, strict=True):
        row.update(row_factors)
    return list(dict.fromkeys(name for row_factors in factors for name in row_factors))


def factor_columns(frame: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The swept factors beyond the identity columns: columns neither run-table, long-table nor ``config.*``."""
    known = {*RUN_COLUMNS, *LONG_COLUMNS, "loadable", *exclude}
    return [c for c in frame.columns if c not in known and not str(c).startswith("config.")]


def _factor_values(values: pd.Series) -> pd.Series:
    """Numbers as float64 (NaN where missing), anything else as text."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return pd.to_numeric(values, errors="coerce").astype(np.float64)
    return pd.Series([None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values],
                     index=values.index, dtype=object)


def make_run_table(rows: Sequence[Mapping[str, Any]], factors: Sequence[str] = ()) -> pd.DataFrame:
    """Run-table rows -> the run table: :data:`RUN_COLUMNS`, ``factors``, then config columns sorted; fixed dtypes."""
    frame = pd.DataFrame.from_records(list(rows)) if rows else pd.DataFrame(columns=list(RUN_COLUMNS))
    for column in (*RUN_COLUMNS, *factors):
        if column not in frame.columns:
            frame[column] = None
    config_columns = sorted(c for c in frame.columns if c not in RUN_COLUMNS and c not in factors)
    frame = frame[[*RUN_COLUMNS, *factors, *config_columns]].reset_index(drop=True)
    for column in factors:
        frame[column] = _factor_values(frame[column])
    for column in CATEGORY_COLUMNS:
        frame[column] = frame[column].astype("string").fillna("unknown" if column != "run" else "")
    frame["alpha"] = pd.to_numeric(frame["alpha"], errors="coerce").astype(np.float64)
    frame["seed"] = pd.array([as_seed(v) for v in frame["seed"]], dtype="Int64")
    frame["status_step"] = pd.array([as_seed(v) for v in frame["status_step"]], dtype="Int64")
    frame["wall_time_s"] = pd.to_numeric(frame["wall_time_s"], errors="coerce").astype(np.float64)
    frame["included"] = frame["included"].fillna(False).astype(bool)
    return frame


def build_long_table(runs: pd.DataFrame, run_metrics: Mapping[int, RunMetrics]) -> pd.DataFrame:
    """Long table from the run table and ``{run-table row position: RunMetrics}``, ordered by run, metric, step."""
    vocabulary = sorted({name for metrics in run_metrics.values() for name in metrics.names})
    code_of = {name: code for code, name in enumerate(vocabulary)}
    blocks = []  # per run: (run position, metric code, step, value), flattened metric-major
    for position in sorted(run_metrics):
        metrics = run_metrics[position]
        if not metrics.names or len(metrics.steps) == 0:
            continue
        codes = np.fromiter((code_of[name] for name in metrics.names), dtype=np.int32, count=len(metrics.names))
        order = np.argsort(codes, kind="stable")
        flat_values = metrics.values[order].ravel()
        finite = np.isfinite(flat_values)  # steps a metric was not logged at (NaN in the wide table) are dropped
        blocks.append((np.full(int(finite.sum()), position, dtype=np.int32),
                       np.repeat(codes[order], len(metrics.steps))[finite],
                       np.tile(metrics.steps, len(codes))[finite], flat_values[finite]))
    empty = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64))
    run_positions, metric_codes, steps, values = (np.concatenate(parts) for parts in zip(empty, *blocks, strict=True))
    columns: dict[str, Any] = {}
    for column in CATEGORY_COLUMNS:
        per_run = pd.Categorical(runs[column].astype(str))
        columns[column] = pd.Categorical.from_codes(per_run.codes[run_positions], dtype=per_run.dtype)
    columns["alpha"] = runs["alpha"].to_numpy(dtype=np.float64)[run_positions]
    for column in factor_columns(runs):
        columns[column] = runs[column].to_numpy()[run_positions]
    columns["seed"] = runs["seed"].array.take(run_positions)
    columns["step"] = steps
    columns["metric"] = pd.Categorical.from_codes(metric_codes, categories=pd.Index(vocabulary, dtype=str))
    columns["value"] = values
    return pd.DataFrame(columns, copy=False)


def histogram_table(records: Sequence[Mapping[str, Any]] = (), factors: Sequence[str] = ()) -> pd.DataFrame:
    """Histogram records -> :data:`HISTOGRAM_COLUMNS` with the ``factors`` between the identity columns and ``step``
    (none without records, as a run store's sweep without histograms)."""
    columns = [*IDENTITY_COLUMNS, *(factors if records else ()), *HISTOGRAM_COLUMNS[len(IDENTITY_COLUMNS):]]
    table = pd.DataFrame.from_records(list(records), columns=columns)
    for column in factors if records else ():
        table[column] = _factor_values(table[column])
    return table.astype({"alpha": np.float64, "seed": "Int64", "step": np.int64})


def parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding mixed types (a config key that is an int in one run and text in another) -> text."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            kinds = {type(v) for v in frame[column] if v is not None and not (isinstance(v, float) and math.isnan(v))}
            if len(kinds) > 1 or (kinds and not kinds <= {str}):
                frame[column] = [None if v is None else str(v) for v in frame[column]]
    return frame


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` through the run store's atomic writer."""
    with run_store.atomic_path(path) as temporary:
        frame.to_parquet(temporary, index=False)

