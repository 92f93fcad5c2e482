"""The parquet files compacted from the jsonl files at close: ``metrics.parquet`` wide (``step`` then one float64
column per key; a key missing at a step is null), ``histograms.parquet`` long (:data:`HISTOGRAM_SCHEMA`)."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dataflex_rl.tracking.run_store.files import atomic_path

LOG = logging.getLogger(__name__)

HISTOGRAM_SCHEMA = pa.schema([("step", pa.int64()), ("name", pa.string()), ("edges", pa.list_(pa.float64())),
                              ("counts", pa.list_(pa.int64()))])


def _duplicates_warning(what: str, path_hint: str, duplicates: list[Any]) -> None:
    shown = ", ".join(map(str, duplicates[:5])) + (" ..." if len(duplicates) > 5 else "")
    LOG.warning("%s: %d %s appear more than once (%s); the last value of each key is kept", path_hint,
                len(duplicates), what, shown)


def metrics_table(records: Sequence[Mapping[str, Any]], source: str = "metrics") -> pa.Table:
    rows: dict[int, dict[str, float]] = {}
    duplicates = []
    for record in records:
        step = record["step"]
        if step in rows:
            duplicates.append(step)
        rows.setdefault(step, {}).update((key, value) for key, value in record.items() if key != "step")
    if duplicates:
        _duplicates_warning("steps", source, duplicates)
    steps = sorted(rows)
    columns = {"step": pa.array(steps, type=pa.int64())}
    for key in sorted({key for row in rows.values() for key in row}):
        values = [rows[step].get(key) for step in steps]
        columns[key] = pa.array([None if value is None else float(value) for value in values], type=pa.float64())
    return pa.table(columns)


def histograms_table(records: Sequence[Mapping[str, Any]], source: str = "histograms") -> pa.Table:
    """Long table ``step, name, edges, counts`` (:data:`HISTOGRAM_SCHEMA`) sorted by (step, name); last one wins."""
    latest: dict[tuple[int, str], Mapping[str, Any]] = {}
    duplicates = []
    for record in records:
        key = (record["step"], record["name"])
        if key in latest:
            duplicates.append(key)
        latest[key] = record
    if duplicates:
        _duplicates_warning("(step, name) pairs", source, duplicates)
    ordered = [latest[key] for key in sorted(latest)]
    return pa.table({"step": [record["step"] for record in ordered], "name": [record["name"] for record in ordered],
                     "edges": [[float(edge) for edge in record["edges"]] for record in ordered],
                     "counts": [[int(count) for count in record["counts"]] for record in ordered]},
                    schema=HISTOGRAM_SCHEMA)


def write_parquet(path: pathlib.Path, table: pa.Table) -> None:
    with atomic_path(path) as temporary:
        pq.write_table(table, temporary)
