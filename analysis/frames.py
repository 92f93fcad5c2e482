"""The tables every loader returns (run store, W&B online, W&B offline), and how they are built.

Column sets (:data:`IDENTITY_COLUMNS`, :data:`LONG_COLUMNS`, :data:`RUN_COLUMNS`, :data:`HISTOGRAM_COLUMNS`), the
result type :class:`SweepData`, one run's metrics :class:`RunMetrics`, and the builders every loader shares: the run
table (:func:`make_run_table`), the long table (:func:`build_long_table`), the histogram table
(:func:`histogram_table`) and the factor columns (a run's recorded axes, :func:`axis_factors`, :func:`pop_factors`).
:mod:`analysis.load` documents the tables' columns; this module reads no file, so every loader can import it.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
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
    "end_time", "environment", "warm_start", "warm_start_design", "warm_start_seed", "path", "metrics_source", "included", "exclusion_reason",
)
COMPLETED = run_store.COMPLETED
RUN_STATES: tuple[str, ...] = run_store.STATES


@dataclass(frozen=True)
class SweepData:
    """What a loader returns: the run table, the long metrics table and the histogram table (see module doc)."""

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
    """One run's metrics in wide form: ``steps`` ``(n,)`` int64 sorted unique, ``values`` ``(m, n)`` float64."""

    steps: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray


def flatten_config(config: Mapping[str, Any], prefix: str = "config.") -> dict[str, Any]:
    """The run store's :func:`~dataflex_rl.tracking.run_store.flatten_config` as table columns: ``{prefix +
    "a.b.c": value}``, lists and empty mappings as JSON text (a cell holds one scalar)."""
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
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def select_names(names: Iterable[str], patterns: Sequence[str] | None) -> list[str]:
    """Names matching any of ``patterns`` (exact keys or ``fnmatch`` globs such as ``grad_norm/by_prob/*``)."""
    names = list(names)
    if patterns is None:
        return names
    return [name for name in names if any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)]


# --- factors ---------------------------------------------------------------------------------------------------


def axis_factors(axes: Any) -> dict[str, Any]:
    """A run's recorded axes (``meta.json``'s or the W&B config's ``run_identity.axes``) -> its factor columns: every
    axis but those the identity columns already hold (alpha, seed, the preset label). Not a mapping: none."""
    if not isinstance(axes, Mapping):
        return {}
    return {str(name): value for name, value in axes.items() if name not in IDENTITY_COLUMNS}


def pop_factors(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Move each run-table row's ``factors`` mapping into columns of the row (in place); return the factor column
    names in first-seen order (a row without one of them gets NaN from :func:`make_run_table`)."""
    names: dict[str, None] = {}
    for row in rows:
        for name, value in (row.pop("factors", None) or {}).items():
            row[name] = value
            names[name] = None
    return list(names)


def factor_columns(frame: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The swept factors of a run table or long table beyond the identity columns (``eta``, ``trainer.lr``, ...), in
    table order: the columns that are neither run-table, long-table nor ``config.*`` columns, nor in ``exclude``."""
    known = {*RUN_COLUMNS, *LONG_COLUMNS, "loadable", *exclude}
    return [c for c in frame.columns if c not in known and not str(c).startswith("config.")]


def _factor_values(values: pd.Series) -> pd.Series:
    """Numbers as float64 (NaN where a run lacks the factor); anything else as text (None stays missing)."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return pd.to_numeric(values, errors="coerce").astype(np.float64)
    return pd.Series([None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values],
                     index=values.index, dtype=object)



# --- building the tables ---------------------------------------------------------------------------------------


def make_run_table(rows: Sequence[Mapping[str, Any]], factors: Sequence[str] = ()) -> pd.DataFrame:
    """Run-table rows (dicts with the :data:`RUN_COLUMNS` keys, any missing one left empty, plus ``factors`` and
    ``config.*`` keys) -> the run table with fixed column order and dtypes (factors, then config columns, sorted)."""
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
    """Long table (module doc) from the run table and ``{run-table row position: RunMetrics}``.

    Every array is built once: per run, the ``(m, n)`` value block is flattened metric-major (so rows come out ordered
    by run, metric, step), non-finite values are dropped, and the blocks are concatenated in one call per column.
    """
    vocabulary = sorted({name for metrics in run_metrics.values() for name in metrics.names})
    code_of = {name: code for code, name in enumerate(vocabulary)}
    run_blocks, metric_blocks, step_blocks, value_blocks = [], [], [], []
    for position in sorted(run_metrics):
        metrics = run_metrics[position]
        if not metrics.names or len(metrics.steps) == 0:
            continue
        codes = np.fromiter((code_of[name] for name in metrics.names), dtype=np.int32, count=len(metrics.names))
        order = np.argsort(codes, kind="stable")
        values = metrics.values[order]
        n_steps = len(metrics.steps)
        flat_values = values.ravel()
        flat_steps = np.tile(metrics.steps, len(codes))
        flat_metrics = np.repeat(codes[order], n_steps)
        finite = np.isfinite(flat_values)
        if not finite.all():  # steps a metric was not logged at (NaN in the wide table) are dropped
            flat_values, flat_steps, flat_metrics = flat_values[finite], flat_steps[finite], flat_metrics[finite]
        value_blocks.append(flat_values)
        step_blocks.append(flat_steps)
        metric_blocks.append(flat_metrics)
        run_blocks.append(np.full(flat_values.size, position, dtype=np.int32))
    if value_blocks:
        run_positions = np.concatenate(run_blocks)
        metric_codes = np.concatenate(metric_blocks)
        steps = np.concatenate(step_blocks)
        values = np.concatenate(value_blocks)
    else:
        run_positions = np.empty(0, np.int32)
        metric_codes = np.empty(0, np.int32)
        steps = np.empty(0, np.int64)
        values = np.empty(0, np.float64)

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



def empty_histogram_table() -> pd.DataFrame:
    """A histogram table with no rows and the columns of :data:`HISTOGRAM_COLUMNS`."""
    frame = pd.DataFrame({column: pd.Series(dtype=object) for column in HISTOGRAM_COLUMNS})
    frame["alpha"] = frame["alpha"].astype(np.float64)
    frame["seed"] = frame["seed"].astype("Int64")
    frame["step"] = frame["step"].astype(np.int64)
    return frame



def histogram_table(records: Sequence[Mapping[str, Any]], factors: Sequence[str] = ()) -> pd.DataFrame:
    """Histogram records (identity columns, factor values, ``step``, ``name``, ``edges``, ``counts``) -> the histogram
    table: :data:`HISTOGRAM_COLUMNS` with the ``factors`` between the identity columns and ``step``."""
    if not records:
        return empty_histogram_table()  # like a run store's sweep without histograms: no factor columns
    columns = [*IDENTITY_COLUMNS, *factors, *HISTOGRAM_COLUMNS[len(IDENTITY_COLUMNS):]]
    table = pd.DataFrame.from_records(list(records), columns=columns)
    for column in factors:
        table[column] = _factor_values(table[column])
    table["alpha"] = table["alpha"].astype(np.float64)
    table["seed"] = table["seed"].astype("Int64")
    return table


# --- parquet -----------------------------------------------------------------------------------------------------


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
    """Write ``frame`` to ``path`` through the run store's atomic writer (group-readable, no temp file left behind)."""
    with run_store.atomic_path(path) as temporary:
        frame.to_parquet(temporary, index=False)


