"""The files of a run folder (their content: ``docs/run_store.md``), their names, and how every one of them is
written: through a hidden temp file beside its target, fsync'ed and renamed onto it, with one file mode."""

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

CONFIG_FILE, META_FILE, STATUS_FILE = "config.yaml", "meta.json", "status.json"
SWEEP_FILE = "sweep.json"  # a sweep folder's record, beside its run folders (written by sweeps.manifest)
METRICS_JSONL, METRICS_PARQUET = "metrics.jsonl", "metrics.parquet"
HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET = "histograms.jsonl", "histograms.parquet"
LOCK_FILE, RESERVE_FILE, CHECKPOINT_DIR = ".run.lock", ".status.reserve", "checkpoints"


class RunStoreError(ValueError):
    """A run-store file that exists but cannot be read; the message names the file and what is wrong."""


def utc_now() -> str:
    """Current time, ISO 8601 in UTC with milliseconds (``2026-01-31T12:00:00.123+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def file_mode() -> int:
    """``0o666`` less the umask, read from /proc where it can be (``os.umask`` can only be read by setting it)."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status", encoding="ascii") as status:
        return 0o666 & ~int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def pretty_json(obj: Any) -> bytes:  # as the store's JSON files hold it
    return (json.dumps(obj, indent=2, allow_nan=True, ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_path`, fsync'ed: a reader sees the old or the new content."""
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_json(path: pathlib.Path, obj: Any) -> None:
    atomic_write_bytes(path, pretty_json(obj))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a hidden temp path beside ``path`` (``.<name>.<random>.tmp``, mode :func:`file_mode`)."""
    path = pathlib.Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(descriptor)
    try:
        os.chmod(temporary, file_mode())
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        pathlib.Path(temporary).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(run_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp files an interrupted write left in the run folder and its ``checkpoints/`` (names returned)."""
    run_dir = pathlib.Path(run_dir)
    removed = []
    for path in (*run_dir.glob(".*.tmp"), *(run_dir / CHECKPOINT_DIR).glob(".*.tmp")):
        if path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        LOG.info("%s: removed temp files left by an interrupted write: %s", run_dir, ", ".join(removed))
    return removed


def read_json_object(path: pathlib.Path) -> dict[str, Any] | None:
    """A JSON object file, None when absent; :class:`RunStoreError` naming the file when it cannot be parsed."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as error:
        raise RunStoreError(f"{path} is not valid JSON ({error}); it may have been cut short") from error
    except (OSError, UnicodeDecodeError) as error:
        raise RunStoreError(f"{path} cannot be read: {error}") from error
    if not isinstance(payload, dict):
        raise RunStoreError(f"{path} holds a {type(payload).__name__}, expected a JSON object")
    return payload
