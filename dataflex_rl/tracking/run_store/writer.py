"""The writer: :class:`RunStore`, one run's folder, written by one process (see :mod:`.lock`)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import numbers
import os
import pathlib
import traceback as traceback_module
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import yaml

from dataflex_rl.tracking.base import check_close_state
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store.files import (
    CONFIG_FILE,
    HISTOGRAMS_JSONL,
    HISTOGRAMS_PARQUET,
    META_FILE,
    METRICS_JSONL,
    METRICS_PARQUET,
    RunStoreError,
    atomic_write_bytes,
    atomic_write_json,
    utc_now,
)
from dataflex_rl.tracking.run_store.fingerprint import config_fingerprint
from dataflex_rl.tracking.run_store.jsonl import (
    append_record,
    dumps_line,
    open_for_append,
    read_jsonl,
    read_jsonl_with_tail,
)
from dataflex_rl.tracking.run_store.lock import RunLock
from dataflex_rl.tracking.run_store.meta import check_extra, session_meta, with_end_time
from dataflex_rl.tracking.run_store.reader import read_config, read_meta, read_status
from dataflex_rl.tracking.run_store.status import COMPLETED, FAILED, SpaceReserve, check_state, write_status
from dataflex_rl.tracking.run_store.tables import histograms_table, metrics_table, write_parquet
from dataflex_rl.validation import to_plain

LOG = logging.getLogger(__name__)


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step = {step!r} is not allowed: it must be an integer >= 0")
    return int(step)


def _as_list(values: Any) -> list:
    """A plain list from a list, tuple, numpy array or torch tensor (``tolist`` avoids per-element conversion)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _tolerant(reader: Callable[[pathlib.Path], Any], run_dir: pathlib.Path) -> Any:
    """``reader(run_dir)``, or None when the file is damaged (logged): for writers that must not fail on it."""
    try:
        return reader(run_dir)
    except (RunStoreError, OSError) as error:
        LOG.warning("%s", error)
        return None


def _histogram_record(step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> dict[str, Any]:
    """The ``histograms.jsonl`` record of one histogram; ``ValueError`` saying what is wrong with it."""
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
    return {"step": step, "name": name, "edges": edge_values, "counts": count_values}


class RunStore:
    """One run's folder. Also a :class:`~dataflex_rl.tracking.base.Logger` (config, metrics, histograms, close).

    Open it, then on resume from a checkpoint at step ``s`` call :meth:`truncate_after` before logging step
    ``s + 1``. Appending after a hard kill is safe without it too: a partial last line is cut before the first
    append. A writer that may share the folder with another process takes :meth:`lock` first.

    A failure is always recorded (``record_error``, ``close("failed")``): from what the store holds in memory,
    never by re-reading its files, and however full the disk (:mod:`.status`).
    """

    name = "run_store"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._last_metrics_step: int | None = None
        self._warned_order = False
        self._closed = False
        self._status: dict[str, Any] | None = None  # the last status this object wrote
        self._fingerprint: str | None = None
        self._reserve = SpaceReserve(self.run_dir)

    def path(self, file_name: str) -> pathlib.Path:
        """``<run_dir>/<file_name>``."""
        return self.run_dir / file_name

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (its status is then final)."""
        return self._closed

    def lock(self) -> RunLock:
        """The run's :class:`RunLock` (acquired): one writer per run. Release it (or use ``with``) when done."""
        return RunLock(self.run_dir).acquire()

    # --- config, meta, status ------------------------------------------------------------------------------
    def write_config(self, config: Mapping[str, Any]) -> None:
        """``config.yaml``: the resolved config, keys in their given order; its :func:`config_fingerprint` goes
        into ``meta.json`` (now, when meta exists, else with the next :meth:`write_meta`)."""
        plain = to_plain(config)
        text = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write_bytes(self.path(CONFIG_FILE), text.encode("utf-8"))
        self._fingerprint = config_fingerprint(plain)
        meta = _tolerant(read_meta, self.run_dir)
        if meta is not None and meta.get("config_fingerprint") != self._fingerprint:
            meta["config_fingerprint"] = self._fingerprint
            atomic_write_json(self.path(META_FILE), meta)

    def read_config(self) -> dict[str, Any] | None:
        """See :func:`~dataflex_rl.tracking.run_store.reader.read_config`."""
        return read_config(self.run_dir)

    def write_meta(
        self, identity: RunIdentity, extra: Mapping[str, Any] | None = None, *, now: str | None = None
    ) -> dict[str, Any]:
        """``meta.json`` at the start of a (possibly resumed) session; returns what was written.

        A resumed run keeps its first ``start_time`` and appends the session start to ``resume_times``.
        ``end_time`` and ``wall_time_s`` are null until :meth:`close`, which sets
        ``wall_time_s = end_time - start_time`` (for a resumed run, including the time between sessions).
        ``now``: the session's start time (ISO 8601), default the current time. ``config_fingerprint`` is that of
        the config written by :meth:`write_config` (this session's, else the recorded one).
        """
        extra = dict(extra or {})
        check_extra(extra)
        now = now or utc_now()
        previous = self.read_meta() or {}
        fingerprint = self._fingerprint or previous.get("config_fingerprint")
        if fingerprint is None:
            recorded = _tolerant(read_config, self.run_dir)
            fingerprint = config_fingerprint(recorded) if recorded is not None else None
        meta = session_meta(identity, previous, fingerprint, extra, now)
        atomic_write_json(self.path(META_FILE), meta)
        return meta

    def read_meta(self) -> dict[str, Any] | None:
        """See :func:`~dataflex_rl.tracking.run_store.reader.read_meta`."""
        return read_meta(self.run_dir)

    def set_status(
        self, state: str, step: int | None = None, error: str | None = None, traceback: str | None = None
    ) -> dict[str, Any]:
        """Write ``status.json``; ``step`` None keeps the previous status's step (0 at first).

        ``failed`` and ``interrupted`` are written even on a full disk (see :meth:`record_error`); ``running``
        keeps a small reserve file on disk for that.
        """
        check_state(state)
        if step is None:
            previous = self._status if self._status is not None else _tolerant(read_status, self.run_dir)
            step = (previous or {}).get("step", 0)
        status = {
            "state": state,
            "step": _check_step(step),
            "updated": utc_now(),
            "error": error,
            "traceback": traceback,
        }
        write_status(self.run_dir, status, self._reserve)
        self._status = status
        return status

    def read_status(self) -> dict[str, Any] | None:
        """See :func:`~dataflex_rl.tracking.run_store.reader.read_status`."""
        return read_status(self.run_dir)

    def record_error(self, state: str, error: str, traceback: str | None = None) -> None:
        """Status ``state`` with the error message and traceback; a later ``close(state)`` keeps them.

        Reads nothing from the store (its files may be what failed) and needs no free space.
        """
        self.set_status(state, step=self._known_step(), error=error, traceback=traceback)

    def _known_step(self) -> int:
        """The last step this process logged, else the last status step it wrote, else 0: from memory only."""
        if self._last_metrics_step is not None:
            return self._last_metrics_step
        return int((self._status or {}).get("step", 0))

    def _release_reserve(self) -> bool:
        """Give back the run's space reserve (see :class:`~dataflex_rl.tracking.run_store.status.SpaceReserve`)."""
        return self._reserve.release()

    # --- Logger protocol -----------------------------------------------------------------------------------
    def log_config(self, config: dict) -> None:
        """Write ``config.yaml`` (see :meth:`write_config`)."""
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
        record = _histogram_record(_check_step(step), name, edges, counts)
        self._append(HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET, record)

    def close(self, state: str = "completed", *, end_time: str | None = None) -> None:
        """Compact the jsonl files to parquet, stamp ``end_time``/``wall_time_s`` in meta, set the final status.

        The jsonl files stay (a later resume appends to them). If the status already holds ``state`` with an
        error (from :meth:`record_error`), the error and traceback are kept. A second call does nothing.
        Closing as ``failed`` or ``interrupted`` always writes the status, even when the files cannot be read;
        closing as ``completed`` when they cannot be compacted records ``failed`` and raises. ``end_time``:
        ISO 8601, default the current time.
        """
        check_close_state(state)
        if self._closed:
            return
        self._closed = True
        self._close_handles()
        last_step = None
        try:
            last_step = self.compact()
            self._stamp_end_time(end_time or utc_now())
        except Exception as error:
            if state == COMPLETED:
                self.set_status(FAILED, step=self._known_step(), error=f"{type(error).__name__}: {error}",
                                traceback=traceback_module.format_exc())
                self._reserve.release()
                raise
            LOG.warning("%s: could not compact the run store while closing it as %s (%s: %s)", self.run_dir,
                        state, type(error).__name__, error)
        current = self._status if self._status is not None else (_tolerant(read_status, self.run_dir) or {})
        same_state = current.get("state") == state
        step = last_step if last_step is not None else self._known_step() or current.get("step", 0)
        self.set_status(
            state,
            step=step,
            error=current.get("error") if same_state else None,
            traceback=current.get("traceback") if same_state else None,
        )
        self._reserve.release()

    def _stamp_end_time(self, end: str) -> None:
        meta = self.read_meta()
        if meta is not None:
            atomic_write_json(self.path(META_FILE), with_end_time(meta, end))

    # --- files ---------------------------------------------------------------------------------------------
    def compact(self) -> int | None:
        """Write ``metrics.parquet`` and ``histograms.parquet`` from the jsonl files (empty tables if none).

        Returns the last metrics step (None when nothing was logged)."""
        metrics_path = self.path(METRICS_JSONL)
        table = metrics_table(read_jsonl(metrics_path), source=str(metrics_path))
        write_parquet(self.path(METRICS_PARQUET), table)
        histograms_path = self.path(HISTOGRAMS_JSONL)
        write_parquet(
            self.path(HISTOGRAMS_PARQUET), histograms_table(read_jsonl(histograms_path), source=str(histograms_path))
        )
        steps = table.column("step")
        return int(steps[len(steps) - 1].as_py()) if len(steps) else None

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
            records, partial = read_jsonl_with_tail(path)
            kept = [record for record in records if record["step"] <= step]
            dropped += len(records) - len(kept)
            if len(kept) != len(records) or partial:
                atomic_write_bytes(path, b"".join(dumps_line(record) for record in kept))
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
            # The parquet is a snapshot of the jsonl taken at close; once the jsonl grows it is stale.
            with contextlib.suppress(FileNotFoundError):
                self.path(parquet_name).unlink()
            handle = open_for_append(self.path(file_name))
            self._handles[file_name] = handle
        append_record(handle, record)

    def detach(self) -> None:
        """Close the open log files without closing the run: no compaction, no status (what a killed writer
        leaves behind; also for a writer handing the run to another process)."""
        self._close_handles()

    def _close_handles(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r})"
