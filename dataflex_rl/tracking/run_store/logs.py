"""The step logs: ``metrics.jsonl`` and ``histograms.jsonl`` while the run goes (one record per line, appended with
one ``write(2)`` each; the partial last line a hard kill leaves is dropped by readers and cut before the next append),
compacted at close into ``metrics.parquet`` (wide: ``step`` then one float64 column per key, null where a key was not
logged) and ``histograms.parquet`` (long: :data:`HISTOGRAM_SCHEMA`)."""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from dataflex_rl.tracking.run_store.files import RunStoreError, atomic_path

LOG = logging.getLogger(__name__)

HISTOGRAM_SCHEMA = pa.schema([("step", pa.int64()), ("name", pa.string()), ("edges", pa.list_(pa.float64())),
                              ("counts", pa.list_(pa.int64()))])


def dumps_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, allow_nan=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def read_jsonl(path: str | os.PathLike[str], *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """Records of a run-store jsonl file (``[]`` when missing); a partial last line is dropped with a warning."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    # A file ending in "\n" leaves an empty tail; anything else there is a line without its newline.
    *lines, tail = path.read_bytes().split(b"\n")
    records, bad_lines = [], []
    for number, line in enumerate(lines, start=1):
        record = _parse_record(line) if line.strip() else {}
        if record is None and not skip_bad:
            raise RunStoreError(f"{path}: line {number} is not a run-store record: {line[:200]!r}")
        if record is None:
            bad_lines.append(number)
        elif record:
            records.append(record)
    if bad_lines:
        LOG.warning("%s: skipped %d unreadable line(s): %s", path, len(bad_lines), bad_lines[:5])
    last = _parse_record(tail) if tail.strip() else {}
    if last is None:
        LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(tail))
    elif last:
        records.append(last)
    return records


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def open_for_append(path: pathlib.Path) -> BinaryIO:
    """``path`` opened unbuffered for appending (one ``write(2)`` per record), a partial last line cut."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                data = path.read_bytes()
                cut = data.rfind(b"\n") + 1
                if _parse_record(data[cut:]) is not None:  # a whole record without its newline
                    handle.write(b"\n")
                else:
                    LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path,
                                len(data) - cut)
                    handle.truncate(cut)
    return open(path, "ab", buffering=0)  # noqa: SIM115 - the caller owns the handle


def append_record(handle: BinaryIO, record: Mapping[str, Any]) -> None:
    data = memoryview(dumps_line(record))
    while data:  # a raw write may be short (signal, near-full disk): write the rest
        data = data[handle.write(data) :]


class JsonlTail:
    """The records appended to a jsonl file since the last :meth:`read`, while the run writes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        """New complete records (dicts with an integer ``step``); [] when the file does not exist yet."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset, self.partial = 0, b""
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [record for record in map(_parse_record, lines) if record is not None]


def _merged(records: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Hashable], what: str,
            source: str) -> list[dict[str, Any]]:
    """One record per ``key``, sorted by it; a later record's values win (its other keys are kept)."""
    rows: dict[Any, dict[str, Any]] = {}
    duplicates = []
    for record in records:
        if key(record) in rows:
            duplicates.append(key(record))
        rows.setdefault(key(record), {}).update(record)
    if duplicates:
        shown = ", ".join(map(str, duplicates[:5])) + (" ..." if len(duplicates) > 5 else "")
        LOG.warning("%s: %d %s appear more than once (%s); the last value of each key is kept", source,
                    len(duplicates), what, shown)
    return [rows[value] for value in sorted(rows)]


def metrics_table(records: Sequence[Mapping[str, Any]], source: str = "metrics") -> pa.Table:
    rows = _merged(records, lambda record: record["step"], "steps", source)
    names = sorted({key for row in rows for key in row} - {"step"})
    return pa.Table.from_pylist(rows, schema=pa.schema([("step", pa.int64()), *((key, pa.float64()) for key in names)]))


def histograms_table(records: Sequence[Mapping[str, Any]], source: str = "histograms") -> pa.Table:
    rows = _merged(records, lambda record: (record["step"], record["name"]), "(step, name) pairs", source)
    return pa.Table.from_pylist(rows, schema=HISTOGRAM_SCHEMA)


def write_parquet(path: pathlib.Path, table: pa.Table) -> None:
    with atomic_path(path) as temporary:
        pq.write_table(table, temporary)
