"""The writer: :class:`RunStore`, one run's folder, written by one process at a time (:class:`RunLock`)."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import numbers
import os
import pathlib
import socket
import traceback as traceback_module
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

import filelock
import yaml

from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store.files import (CONFIG_FILE, HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET, LOCK_FILE,
                                                 META_FILE, METRICS_JSONL, METRICS_PARQUET, RunStoreError,
                                                 atomic_write_bytes, atomic_write_json, utc_now)
from dataflex_rl.tracking.run_store.logs import (append_record, dumps_line, histograms_table, metrics_table,
                                                open_for_append, read_jsonl, write_parquet)
from dataflex_rl.tracking.run_store.meta import environment_record, numeric_environment, package_versions
from dataflex_rl.tracking.run_store.reader import read_config, read_meta, read_status
from dataflex_rl.tracking.run_store.status import COMPLETED, FAILED, SpaceReserve, check_state, write_status
from dataflex_rl.tracking.run_store.verify import config_fingerprint
from dataflex_rl.validation import ConfigError, to_plain

LOG = logging.getLogger(__name__)
# Each jsonl log and the parquet compacted from it at close (stale as soon as the jsonl grows).
_LOGS = {METRICS_JSONL: METRICS_PARQUET, HISTOGRAMS_JSONL: HISTOGRAMS_PARQUET}
# meta.json keys written by the store itself; ``RunStore.write_meta(extra=...)`` may not override them.
RESERVED_META_KEYS = frozenset({"versions", "host", "environment", "environment_changes", "start_time", "end_time",
                                "wall_time_s", "resume_times", "config_fingerprint", *RunIdentity.__dataclass_fields__})


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step = {step!r} is not allowed: it must be an integer >= 0")
    return int(step)


def _as_list(values: Any) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _tolerant(reader: Callable[[pathlib.Path], Any], run_dir: pathlib.Path) -> Any:
    try:
        return reader(run_dir)
    except (RunStoreError, OSError) as error:
        LOG.warning("%s", error)
        return None


class RunLockedError(ConfigError):
    """Another live process holds the run's lock; the message names the run folder and the holder's pid."""


def _write_pid(descriptor: int) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.run.lock``, held for the writer's life."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(run_dir) / LOCK_FILE
        self._lock = filelock.UnixFileLock(
            self.path,
            thread_local=False,
            # The file stays after release (it is only a lock; it names the last writer).
            preserve_lock_file=True,
            # Only a kernel lock is released when its holder is killed; a filesystem without flock raises instead.
            fallback_to_soft=False,
            # filelock opens an existing lock file without truncating it, so a refused process reads this pid.
            on_acquired=_write_pid,
        )

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder's pid; never waits."""
        if self._lock.is_locked:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            raise RunLockedError(
                f"run {self.path.parent} is being written by another process (pid {self.holder()}); one writer per "
                f"run: wait for it or stop it"
            ) from None
        return self

    def holder(self) -> str:
        """The pid recorded in the lock file (the live holder's while the lock is held), or ``"unknown"``."""
        with contextlib.suppress(OSError), open(self.path, "rb") as handle:  # 64 bytes: enough for any pid
            return handle.read(64).decode("ascii", "replace").strip() or "unknown"
        return "unknown"

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class RunStore:
    """One run's folder, and a logger (config, metrics, histograms, close)."""

    name = "run_store"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._last_metrics_step: int | None = None
        self._warned_order = False
        self.closed = False
        self._status: dict[str, Any] | None = None  # the last status this object wrote
        self._fingerprint: str | None = None
        self._reserve = SpaceReserve(self.run_dir)

    def path(self, file_name: str) -> pathlib.Path:
        return self.run_dir / file_name

    def lock(self) -> RunLock:
        """The run's :class:`RunLock` (acquired): one writer per run. Release it (or use ``with``) when done."""
        return RunLock(self.run_dir).acquire()

    def write_config(self, config: Mapping[str, Any]) -> None:
        """``config.yaml``, keys in their given order; its fingerprint goes into ``meta.json``."""
        plain = to_plain(config)
        text = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write_bytes(self.path(CONFIG_FILE), text.encode("utf-8"))
        self._fingerprint = config_fingerprint(plain)
        meta = _tolerant(read_meta, self.run_dir)
        if meta is not None and meta.get("config_fingerprint") != self._fingerprint:
            meta["config_fingerprint"] = self._fingerprint
            atomic_write_json(self.path(META_FILE), meta)

    def write_meta(self, identity: RunIdentity, extra: Mapping[str, Any] | None = None, *,
                   now: str | None = None) -> dict[str, Any]:
        """``meta.json`` at the start of a session starting ``now``, a resumed one keeping its first start time,
        first environment and the record of later ones."""
        clashing = sorted(RESERVED_META_KEYS & dict(extra or {}).keys())
        if clashing:
            raise ValueError(f"write_meta extra keys {clashing} are reserved; reserved keys: "
                             f"{sorted(RESERVED_META_KEYS)}")
        self._reserve.keep()  # the first write of a session: from here a full disk still leaves a status.json
        now = now or utc_now()
        previous = read_meta(self.run_dir) or {}
        fingerprint = self._fingerprint or previous.get("config_fingerprint")
        if fingerprint is None:
            recorded = _tolerant(read_config, self.run_dir)
            fingerprint = config_fingerprint(recorded) if recorded is not None else None
        meta: dict[str, Any] = {
            **identity.to_dict(), "config_fingerprint": fingerprint, "versions": package_versions(),
            "host": socket.gethostname(), **environment_record(previous, numeric_environment(), now),
            "start_time": previous.get("start_time", now), "end_time": None, "wall_time_s": None,
            **({"resume_times": [*previous.get("resume_times", []), now]} if "start_time" in previous else {}),
            **(extra or {})}
        atomic_write_json(self.path(META_FILE), meta)
        return meta

    def set_status(self, state: str, step: int | None = None, error: str | None = None,
                   traceback: str | None = None) -> dict[str, Any]:
        """Write ``status.json`` (:func:`.status.write_status`); ``step`` None keeps the previous status's step."""
        check_state(state)
        if step is None:
            step = self._last_status().get("step", 0)
        status = {"state": state, "step": _check_step(step), "updated": utc_now(), "error": error,
                  "traceback": traceback}
        write_status(self.run_dir, status, self._reserve)
        self._status = status
        return status

    def record_error(self, state: str, error: str, traceback: str | None = None) -> None:
        """Status ``state`` with the error message and traceback (a later ``close(state)`` keeps them)."""
        self.set_status(state, step=self._known_step(), error=error, traceback=traceback)

    def _known_step(self) -> int:
        if self._last_metrics_step is not None:
            return self._last_metrics_step
        return int((self._status or {}).get("step", 0))

    def _last_status(self) -> dict[str, Any]:
        return self._status if self._status is not None else (_tolerant(read_status, self.run_dir) or {})

    log_config = write_config

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
            LOG.warning("log_metrics: step %d after step %d; each step should be logged once, in increasing order "
                        "(compaction keeps the last value of each key)", step, self._last_metrics_step)
        self._last_metrics_step = step
        self._append(METRICS_JSONL, record)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Append one histogram to ``histograms.jsonl``: ``k + 1`` increasing edges, ``k`` integer counts >= 0."""
        step = _check_step(step)
        if not isinstance(name, str) or not name:
            raise ValueError(f"histogram name {name!r} is not allowed: it must be a non-empty string")
        where = f"histogram {name!r} at step {step}"
        edges, counts = [float(edge) for edge in _as_list(edges)], _as_list(counts)
        if len(edges) != len(counts) + 1 or not counts:
            raise ValueError(f"{where}: got {len(edges)} edges and {len(counts)} counts; k >= 1 bins need k + 1 edges")
        if any(not left < right for left, right in itertools.pairwise(edges)):
            raise ValueError(f"{where}: edges must be strictly increasing, got {edges}")
        for count in counts:
            if not (float(count) >= 0 and float(count).is_integer()):
                raise ValueError(f"{where}: count {count!r} is not an integer >= 0")
        counts = [int(float(count)) for count in counts]
        self._append(HISTOGRAMS_JSONL, {"step": step, "name": name, "edges": edges, "counts": counts})

    def close(self, state: str = COMPLETED, *, end_time: str | None = None) -> None:
        """Compact the jsonl to parquet, stamp ``end_time``, set the final status; a second call does nothing."""
        check_state(state, close=True)
        if self.closed:
            return
        self.closed = True
        self.detach()
        last_step = None
        try:
            last_step = self.compact()
            meta, end = read_meta(self.run_dir), end_time or utc_now()
            if meta is not None:  # a resumed run's wall time includes the time between its sessions
                wall = datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(meta["start_time"])
                atomic_write_json(self.path(META_FILE), {**meta, "end_time": end, "wall_time_s": wall.total_seconds()})
        except Exception as error:
            if state == COMPLETED:
                self.set_status(FAILED, step=self._known_step(), error=f"{type(error).__name__}: {error}",
                                traceback=traceback_module.format_exc())
                self._reserve.release()
                raise
            LOG.warning("%s: could not compact the run store while closing it as %s (%s: %s)", self.run_dir,
                        state, type(error).__name__, error)
        current = self._last_status()
        same_state = current.get("state") == state
        step = last_step if last_step is not None else self._known_step() or current.get("step", 0)
        self.set_status(state, step=step, error=current.get("error") if same_state else None,
                        traceback=current.get("traceback") if same_state else None)
        self._reserve.release()

    def compact(self) -> int | None:
        """Write ``metrics.parquet`` and ``histograms.parquet`` from the jsonl files; the last metrics step, or None."""
        metrics_path, histograms_path = self.path(METRICS_JSONL), self.path(HISTOGRAMS_JSONL)
        table = metrics_table(read_jsonl(metrics_path), source=str(metrics_path))
        write_parquet(self.path(METRICS_PARQUET), table)
        write_parquet(self.path(HISTOGRAMS_PARQUET),
                      histograms_table(read_jsonl(histograms_path), source=str(histograms_path)))
        return table["step"][-1].as_py() if table.num_rows else None

    def truncate_after(self, step: int) -> int:
        """Drop every line with ``step > step`` from both jsonl files and the stale parquet; the lines dropped."""
        step = _check_step(step)
        dropped = self._rewrite_logs(lambda record: record["step"] <= step)
        if dropped:
            LOG.info("%s: dropped %d logged line(s) after step %d (resuming from step %d)", self.run_dir, dropped, step,
                     step)
        return dropped

    def clear_logs(self) -> int:
        """Drop every metric and histogram line (a fresh start after an attempt without checkpoint)."""
        return self._rewrite_logs(lambda record: False)

    def _rewrite_logs(self, keep: Callable[[dict[str, Any]], bool]) -> int:
        self.detach()
        dropped = 0
        for file_name, parquet_name in _LOGS.items():
            path = self.path(file_name)
            self.path(parquet_name).unlink(missing_ok=True)
            records = read_jsonl(path)
            kept = [record for record in records if keep(record)]
            dropped += len(records) - len(kept)
            text = b"".join(dumps_line(record) for record in kept)
            if path.exists() and text != path.read_bytes():  # lines dropped, or a partial last line
                atomic_write_bytes(path, text)
        self._last_metrics_step = None
        return dropped

    def last_logged_step(self) -> int | None:
        steps = [record["step"] for record in read_jsonl(self.path(METRICS_JSONL))]
        return max(steps) if steps else None

    def _append(self, file_name: str, record: Mapping[str, Any]) -> None:
        if self.closed:
            raise RuntimeError(f"run store {self.run_dir} is closed; open a new RunStore to log more")
        if file_name not in self._handles:
            self.path(_LOGS[file_name]).unlink(missing_ok=True)
            self._handles[file_name] = open_for_append(self.path(file_name))
        append_record(self._handles[file_name], record)

    def detach(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
