"""The run store: one folder per run, the source of truth for local analysis (format: ``docs/run_store.md``).

Files written here::

    config.yaml          resolved config                                  atomic, at start
    meta.json            identity, versions, host, start/end time         atomic, at start and at close
    status.json          {"state", "step", "updated", "error", "traceback"} atomic, at every state change
    metrics.jsonl        {"step": int, "<key>": float, ...} one line per step, written with one write(2) each
    histograms.jsonl     {"step", "name", "edges": [k+1], "counts": [k]} one line per histogram
    metrics.parquet      wide: step int64, one float64 column per key (sorted), one row per step   at close
    histograms.parquet   long: step int64, name str, edges list<float64>, counts list<int64>      at close

Non-finite numbers: the jsonl files use Python's JSON extension tokens ``NaN``, ``Infinity`` and ``-Infinity``
(``json.dumps(allow_nan=True)``), so NaN, +inf and -inf round-trip exactly through ``json.loads``; readers other than
Python's ``json`` module may refuse these tokens, so read the jsonl with :func:`read_jsonl` or ``json.loads``. In the
parquet files they are IEEE NaN/inf; a key missing at a step is a null (pandas shows both as NaN).

A line reaches the operating system (``write(2)``) before ``log_metrics`` returns, so a killed process loses nothing
already logged; it is not fsync'ed (only a machine crash can lose the last lines; see ``benchmarks/bench_tracking.py``
for the cost of fsync).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import itertools
import json
import logging
import numbers
import os
import pathlib
import platform
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from dataflex_rl.config import to_plain
from dataflex_rl.tracking.base import check_close_state
from dataflex_rl.tracking.identity import RunIdentity

LOG = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
STATUS_FILE = "status.json"
METRICS_JSONL = "metrics.jsonl"
METRICS_PARQUET = "metrics.parquet"
HISTOGRAMS_JSONL = "histograms.jsonl"
HISTOGRAMS_PARQUET = "histograms.parquet"

STATES = ("pending", "running", "completed", "failed", "interrupted")
HISTOGRAM_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("name", pa.string()),
        ("edges", pa.list_(pa.float64())),
        ("counts", pa.list_(pa.int64())),
    ]
)
# meta.json keys written by the store itself; ``write_meta(extra=...)`` may not override them.
_RESERVED_META_KEYS = frozenset(
    {"versions", "host", "start_time", "end_time", "wall_time_s", "resume_times"}
    | {field for field in RunIdentity.__dataclass_fields__}
)
_VERSIONED_DISTRIBUTIONS = {
    "torch": "torch",
    "transformers": "transformers",
    "verl": "verl",
    "dataflex_rl": "dataflex-rl",
}


# --- small helpers -----------------------------------------------------------------------------------------
def utc_now() -> str:
    """Current time, ISO 8601 in UTC with milliseconds (``2026-01-31T12:00:00.123+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value)


def _dumps_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, allow_nan=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, fsync it, then ``os.replace`` it onto ``path``.

    A reader sees the old content or the new one, never a mix; on any error the temp file is removed.
    """
    with _atomic_target(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_json(path: pathlib.Path, obj: Any) -> None:
    """Pretty JSON (``allow_nan``) written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=True, ensure_ascii=False) + "\n").encode("utf-8"))


@contextlib.contextmanager
def _atomic_target(path: pathlib.Path) -> Iterator[str]:
    """Yield a temp path in ``path``'s folder; on success rename it onto ``path``, on error delete it."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _package_versions() -> dict[str, str | None]:
    """Versions from installed package metadata: no package is imported (cheap even for torch and verl)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step = {step!r} is not allowed: it must be an integer >= 0")
    return int(step)


def _as_list(values: Any) -> list:
    """A plain list from a list, tuple, numpy array or torch tensor (``tolist`` avoids per-element conversion)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


# --- jsonl reading -----------------------------------------------------------------------------------------
def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a run-store jsonl file; a partial last line (left by a hard kill) is dropped with a warning.

    Raises ``ValueError`` naming the file and line for a corrupt line elsewhere. A missing file gives ``[]``.
    """
    records, _ = _read_jsonl_with_tail(pathlib.Path(path))
    return records


def _read_jsonl_with_tail(path: pathlib.Path) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether a partial last line was dropped)."""
    if not path.exists():
        return [], False
    data = path.read_bytes()
    lines = data.split(b"\n")
    # ``data`` ending in "\n" leaves an empty last element; anything else there is a line without its newline.
    tail = lines.pop()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse_record(line)
        if record is None:
            raise ValueError(f"{path}: line {number} is not a run-store record: {line[:200]!r}")
        records.append(record)
    dropped = False
    if tail.strip():
        record = _parse_record(tail)
        if record is None:
            LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(tail))
            dropped = True
        else:
            records.append(record)
    return records, dropped


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return record


def _repair_tail(path: pathlib.Path) -> None:
    """Make ``path`` end with a newline before appending: cut a partial last line, or end a complete one."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if _parse_record(data[cut:]) is not None:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")
        else:
            LOG.warning(
                "%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(data) - cut
            )
            handle.truncate(cut)


# --- tables ------------------------------------------------------------------------------------------------
def _duplicates_warning(what: str, path_hint: str, duplicates: list[Any]) -> None:
    shown = ", ".join(map(str, duplicates[:5])) + (" ..." if len(duplicates) > 5 else "")
    LOG.warning(
        "%s: %d %s appear more than once (%s); the last value of each key is kept",
        path_hint,
        len(duplicates),
        what,
        shown,
    )


def metrics_table(records: Sequence[Mapping[str, Any]], source: str = "metrics") -> pa.Table:
    """Wide table from metric records: ``step`` (int64) then one float64 column per key in sorted order.

    One row per step, sorted by step. A key absent at a step is null. A step held by several records is merged,
    later values winning, with a warning (the store writes each step once).
    """
    rows: dict[int, dict[str, float]] = {}
    duplicates = []
    for record in records:
        step = record["step"]
        if step in rows:
            duplicates.append(step)
            rows[step].update((key, value) for key, value in record.items() if key != "step")
        else:
            rows[step] = {key: value for key, value in record.items() if key != "step"}
    if duplicates:
        _duplicates_warning("steps", source, duplicates)
    steps = sorted(rows)
    keys = sorted({key for row in rows.values() for key in row})
    columns = {"step": pa.array(steps, type=pa.int64())}
    for key in keys:
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
    return pa.table(
        {
            "step": [record["step"] for record in ordered],
            "name": [record["name"] for record in ordered],
            "edges": [[float(edge) for edge in record["edges"]] for record in ordered],
            "counts": [[int(count) for count in record["counts"]] for record in ordered],
        },
        schema=HISTOGRAM_SCHEMA,
    )


def _write_parquet(path: pathlib.Path, table: pa.Table) -> None:
    with _atomic_target(path) as temporary:
        pq.write_table(table, temporary)


def load_metrics(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Wide metrics frame of a run (``step`` then one column per key): ``metrics.parquet``, else ``metrics.jsonl``.

    Both sources give the same frame. An open or crashed run has only the jsonl. Missing values and NaN are NaN.
    """
    run_dir = pathlib.Path(run_dir)
    parquet = run_dir / METRICS_PARQUET
    if parquet.exists():
        return pq.read_table(parquet).to_pandas()
    return metrics_table(read_jsonl(run_dir / METRICS_JSONL), source=str(run_dir / METRICS_JSONL)).to_pandas()


def load_histograms(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Histogram frame (``step, name, edges, counts``): ``histograms.parquet``, else ``histograms.jsonl``."""
    run_dir = pathlib.Path(run_dir)
    parquet = run_dir / HISTOGRAMS_PARQUET
    if parquet.exists():
        return pq.read_table(parquet).to_pandas()
    path = run_dir / HISTOGRAMS_JSONL
    return histograms_table(read_jsonl(path), source=str(path)).to_pandas()


# --- the store ---------------------------------------------------------------------------------------------
class RunStore:
    """One run's folder. Also a :class:`~dataflex_rl.tracking.base.Logger` (config, metrics, histograms, close).

    Open it, then on resume from a checkpoint at step ``s`` call :meth:`truncate_after` before logging step
    ``s + 1``. Appending after a hard kill is safe without it too: a partial last line is cut before the first
    append.
    """

    name = "run_store"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._last_metrics_step: int | None = None
        self._warned_order = False
        self._closed = False

    def path(self, file_name: str) -> pathlib.Path:
        return self.run_dir / file_name

    # --- config, meta, status ------------------------------------------------------------------------------
    def write_config(self, config: Mapping[str, Any]) -> None:
        """``config.yaml``: the resolved config, keys in their given order."""
        plain = to_plain(config)
        text = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write_bytes(self.path(CONFIG_FILE), text.encode("utf-8"))

    def read_config(self) -> dict[str, Any] | None:
        path = self.path(CONFIG_FILE)
        return yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None

    def write_meta(self, identity: RunIdentity, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``meta.json`` at the start of a (possibly resumed) session; returns what was written.

        A resumed run keeps its first ``start_time`` and appends the session start to ``resume_times``.
        ``end_time`` and ``wall_time_s`` are null until :meth:`close`, which sets
        ``wall_time_s = end_time - start_time`` (for a resumed run, including the time between sessions).
        """
        extra = dict(extra or {})
        clashing = sorted(_RESERVED_META_KEYS & extra.keys())
        if clashing:
            raise ValueError(
                f"write_meta extra keys {clashing} are reserved; reserved keys: {sorted(_RESERVED_META_KEYS)}"
            )
        now = utc_now()
        previous = self.read_meta() or {}
        meta: dict[str, Any] = {
            **identity.to_dict(),
            "versions": _package_versions(),
            "host": socket.gethostname(),
            "start_time": previous.get("start_time", now),
            "end_time": None,
            "wall_time_s": None,
        }
        if "start_time" in previous:
            meta["resume_times"] = [*previous.get("resume_times", []), now]
        meta.update(extra)
        atomic_write_json(self.path(META_FILE), meta)
        return meta

    def read_meta(self) -> dict[str, Any] | None:
        path = self.path(META_FILE)
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def set_status(
        self, state: str, step: int | None = None, error: str | None = None, traceback: str | None = None
    ) -> dict[str, Any]:
        """Write ``status.json``; ``step`` None keeps the previous status's step (0 at first)."""
        if state not in STATES:
            raise ValueError(f"status state {state!r} is not allowed; allowed states: {', '.join(STATES)}")
        if step is None:
            step = (self.read_status() or {}).get("step", 0)
        status = {
            "state": state,
            "step": _check_step(step),
            "updated": utc_now(),
            "error": error,
            "traceback": traceback,
        }
        atomic_write_json(self.path(STATUS_FILE), status)
        return status

    def read_status(self) -> dict[str, Any] | None:
        path = self.path(STATUS_FILE)
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def record_error(self, state: str, error: str, traceback: str | None = None) -> None:
        """Status ``state`` with the error message and traceback; a later ``close(state)`` keeps them."""
        self.set_status(state, step=self.last_logged_step(), error=error, traceback=traceback)

    # --- Logger protocol -----------------------------------------------------------------------------------
    def log_config(self, config: dict) -> None:
        self.write_config(config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append ``{"step": step, **metrics}`` to ``metrics.jsonl`` (one ``write(2)``); values become floats."""
        step = _check_step(step)
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if not isinstance(key, str) or key == "step":
                raise ValueError(f"metric key {key!r} is not allowed: keys are strings other than 'step'")
            try:
                record[key] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"metric {key!r} at step {step} = {value!r} is not a number") from None
        if self._last_metrics_step is not None and step <= self._last_metrics_step and not self._warned_order:
            self._warned_order = True
            LOG.warning(
                "log_metrics: step %d after step %d; each step should be logged once, in increasing order "
                "(compaction keeps the last value of each key)",
                step,
                self._last_metrics_step,
            )
        self._last_metrics_step = step
        self._append(METRICS_JSONL, METRICS_PARQUET, record)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Append one histogram to ``histograms.jsonl``: ``k + 1`` increasing edges, ``k`` integer counts >= 0."""
        step = _check_step(step)
        if not isinstance(name, str) or not name:
            raise ValueError(f"histogram name {name!r} is not allowed: it must be a non-empty string")
        edge_values = [float(edge) for edge in _as_list(edges)]
        raw_counts = _as_list(counts)
        if len(edge_values) != len(raw_counts) + 1 or not raw_counts:
            raise ValueError(
                f"histogram {name!r} at step {step}: got {len(edge_values)} edges and {len(raw_counts)} counts; "
                f"k >= 1 bins need k + 1 edges"
            )
        if any(not left < right for left, right in itertools.pairwise(edge_values)):
            raise ValueError(f"histogram {name!r} at step {step}: edges must be strictly increasing, got {edge_values}")
        count_values = []
        for count in raw_counts:
            number = float(count)
            if not (number >= 0 and number.is_integer()):
                raise ValueError(f"histogram {name!r} at step {step}: count {count!r} is not an integer >= 0")
            count_values.append(int(number))
        self._append(
            HISTOGRAMS_JSONL,
            HISTOGRAMS_PARQUET,
            {"step": step, "name": name, "edges": edge_values, "counts": count_values},
        )

    def close(self, state: str = "completed") -> None:
        """Compact the jsonl files to parquet, stamp ``end_time``/``wall_time_s`` in meta, set the final status.

        The jsonl files stay (a later resume appends to them). If the status already holds ``state`` with an
        error (from :meth:`record_error`), the error and traceback are kept. A second call does nothing.
        """
        check_close_state(state)
        if self._closed:
            return
        self._closed = True
        self._close_handles()
        self.compact()
        meta = self.read_meta()
        if meta is not None:
            end = utc_now()
            meta["end_time"] = end
            meta["wall_time_s"] = (_parse_time(end) - _parse_time(meta["start_time"])).total_seconds()
            atomic_write_json(self.path(META_FILE), meta)
        current = self.read_status() or {}
        same_state = current.get("state") == state
        step = self.last_logged_step()
        self.set_status(
            state,
            step=step if step is not None else current.get("step", 0),
            error=current.get("error") if same_state else None,
            traceback=current.get("traceback") if same_state else None,
        )

    # --- files ---------------------------------------------------------------------------------------------
    def compact(self) -> None:
        """Write ``metrics.parquet`` and ``histograms.parquet`` from the jsonl files (empty tables if none)."""
        metrics_path = self.path(METRICS_JSONL)
        _write_parquet(self.path(METRICS_PARQUET), metrics_table(read_jsonl(metrics_path), source=str(metrics_path)))
        histograms_path = self.path(HISTOGRAMS_JSONL)
        _write_parquet(
            self.path(HISTOGRAMS_PARQUET), histograms_table(read_jsonl(histograms_path), source=str(histograms_path))
        )

    def truncate_after(self, step: int) -> int:
        """Drop every line with ``step > step`` from both jsonl files (atomic rewrite); returns lines dropped.

        Used on resume from a checkpoint at ``step``, so a step is never held twice. A partial last line is
        dropped too. Stale parquet files are removed (they are rewritten at close).
        """
        step = _check_step(step)
        self._close_handles()
        dropped = 0
        for file_name, parquet_name in ((METRICS_JSONL, METRICS_PARQUET), (HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET)):
            path = self.path(file_name)
            with contextlib.suppress(FileNotFoundError):
                self.path(parquet_name).unlink()
            if not path.exists():
                continue
            records, partial = _read_jsonl_with_tail(path)
            kept = [record for record in records if record["step"] <= step]
            dropped += len(records) - len(kept)
            if len(kept) != len(records) or partial:
                atomic_write_bytes(path, b"".join(_dumps_line(record) for record in kept))
        self._last_metrics_step = None
        if dropped:
            LOG.info(
                "%s: dropped %d logged line(s) after step %d (resuming from step %d)", self.run_dir, dropped, step, step
            )
        return dropped

    def clear_logs(self) -> int:
        """Drop every metric and histogram line (a fresh start of a run whose earlier attempt died before its
        first checkpoint), so no step is held twice; returns lines dropped."""
        dropped = self.truncate_after(0)
        for file_name in (METRICS_JSONL, HISTOGRAMS_JSONL):
            path = self.path(file_name)
            if path.exists():
                dropped += len(read_jsonl(path))
                atomic_write_bytes(path, b"")
        return dropped

    def last_logged_step(self) -> int | None:
        """The largest step in ``metrics.jsonl``, or None when nothing was logged."""
        steps = [record["step"] for record in read_jsonl(self.path(METRICS_JSONL))]
        return max(steps) if steps else None

    def _append(self, file_name: str, parquet_name: str, record: Mapping[str, Any]) -> None:
        if self._closed:
            raise RuntimeError(f"run store {self.run_dir} is closed; open a new RunStore to log more")
        handle = self._handles.get(file_name)
        if handle is None:
            path = self.path(file_name)
            _repair_tail(path)
            # The parquet is a snapshot of the jsonl taken at close; once the jsonl grows it is stale.
            with contextlib.suppress(FileNotFoundError):
                self.path(parquet_name).unlink()
            # Unbuffered: each line is one write(2), visible to readers and safe from a process kill at once.
            handle = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close() / _close_handles()
            self._handles[file_name] = handle
        data = memoryview(_dumps_line(record))
        while data:  # a raw write may be short (signal, near-full disk): write the rest
            data = data[handle.write(data) :]

    def _close_handles(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r})"
