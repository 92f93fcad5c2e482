"""The files of a run folder, their names, and how every one of them is written (atomically, with one file mode).

Files written by the run store (format: ``docs/run_store.md``)::

    config.yaml          resolved config                                  atomic, at start
    meta.json            identity, versions, host, start/end time         atomic, at start and at close
    status.json          {"state", "step", "updated", "error", "traceback"} atomic, at every state change
    metrics.jsonl        {"step": int, "<key>": float, ...} one line per step, written with one write(2) each
    histograms.jsonl     {"step", "name", "edges": [k+1], "counts": [k]} one line per histogram
    metrics.parquet      wide: step int64, one float64 column per key (sorted), one row per step   at close
    histograms.parquet   long: step int64, name str, edges list<float64>, counts list<int64>      at close
    .run.lock            the one writer's lock, holding its pid                  while a writer runs
    .status.reserve      space kept to record a failure on a full disk           while a writer runs

Every file is written through a hidden temp file beside its target (``.<name>.<random>.tmp``), fsync'ed and renamed
onto it, with mode :func:`file_mode`; on any error, a full disk included, the temp file is removed.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pathlib
import tempfile
from collections.abc import Iterator
from typing import Any

LOG = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
STATUS_FILE = "status.json"
SWEEP_FILE = "sweep.json"  # a sweep folder's record, beside its run folders (written by sweeps.manifest)
METRICS_JSONL = "metrics.jsonl"
METRICS_PARQUET = "metrics.parquet"
HISTOGRAMS_JSONL = "histograms.jsonl"
HISTOGRAMS_PARQUET = "histograms.parquet"
LOCK_FILE = ".run.lock"
RESERVE_FILE = ".status.reserve"
CHECKPOINT_DIR = "checkpoints"


class RunStoreError(ValueError):
    """A run-store file that exists but cannot be read; the message names the file and what is wrong."""


def utc_now() -> str:
    """Current time, ISO 8601 in UTC with milliseconds (``2026-01-31T12:00:00.123+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _current_umask() -> int:
    """The process umask, read without changing it where the OS allows (``/proc``); else set and restored."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of every file the store writes: ``0o666`` less the umask (``0o644`` under the usual umask 022).

    ``tempfile.mkstemp`` creates ``0o600`` files, which the rename would carry onto a shared filesystem where
    teammates could not read them; the atomic writers set this mode before the rename.
    """
    return 0o666 & ~_current_umask()


def pretty_json(obj: Any) -> bytes:
    """``obj`` as the store's JSON files hold it: indented, ``NaN``/``Infinity`` allowed, UTF-8, final newline."""
    return (json.dumps(obj, indent=2, allow_nan=True, ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, fsync it, then ``os.replace`` it onto ``path``.

    A reader sees the old content or the new one, never a mix; on any error the temp file is removed.
    """
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_json(path: pathlib.Path, obj: Any) -> None:
    """Pretty JSON (:func:`pretty_json`) written atomically (:func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, pretty_json(obj))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a hidden temp path beside ``path`` (``.<name>.<random>.tmp``, mode :func:`file_mode`); on success it
    is renamed onto ``path``, on any error (a full disk included) it is deleted. For writers that need a path
    (``torch.save``, ``pyarrow``)."""
    path = pathlib.Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(descriptor, file_mode())
    finally:
        os.close(descriptor)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def remove_stale_temporaries(run_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp files an interrupted write left in the run folder and its ``checkpoints/`` (names returned).

    Call only while holding the run's lock (:class:`~dataflex_rl.tracking.run_store.RunLock`): then no writer can
    be using them.
    """
    run_dir = pathlib.Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CHECKPOINT_DIR):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            # ``.<name>.<random>.tmp`` from the atomic writers.
            stale = path.name.startswith(".") and path.name.endswith(".tmp")
            if stale and path.is_file():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(path.name)
    if removed:
        LOG.info("%s: removed temp files left by an interrupted write: %s", run_dir, ", ".join(removed))
    return removed


def read_json_object(path: pathlib.Path) -> dict[str, Any] | None:
    """A JSON object file, None when absent; :class:`RunStoreError` naming the file when it cannot be parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise RunStoreError(f"{path} cannot be read: {error}") from error
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise RunStoreError(f"{path} is not valid JSON ({error}); it may have been cut short") from error
    if not isinstance(payload, dict):
        raise RunStoreError(f"{path} holds a {type(payload).__name__}, expected a JSON object")
    return payload
