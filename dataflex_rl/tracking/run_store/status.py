"""``status.json``: the run states, and writing the record of a failure however full the disk is (a reserve file
kept while a run is open, then ever smaller attempts: :func:`write_despite_full_disk`)."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from dataflex_rl.tracking.run_store.files import RESERVE_FILE, STATUS_FILE, atomic_write_json, pretty_json

LOG = logging.getLogger(__name__)

PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED = "pending", "running", "completed", "failed", "interrupted"
STATES = (PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED)
CLOSE_STATES = (COMPLETED, FAILED, INTERRUPTED)
# Bytes kept on disk while a run is open, given back to record a failure when the disk is full.
RESERVE_BYTES = 256 * 1024
# A traceback longer than this is cut (its end is kept) when the full one cannot be written.
SHORT_TRACEBACK_CHARS = 4000
# The last resort, written over the old status.json's blocks, keeps only this much of the error and traceback.
LAST_RESORT_CHARS = 400


def check_state(state: str, *, close: bool = False) -> str:
    """``state`` when it is one of :data:`STATES` (``close``: of :data:`CLOSE_STATES`); else a ``ValueError``."""
    allowed = CLOSE_STATES if close else STATES
    if state not in allowed:
        raise ValueError(f"{'close' if close else 'status'} state {state!r} is not allowed; "
                         f"allowed states: {', '.join(allowed)}")
    return state


class SpaceReserve:
    """:data:`RESERVE_BYTES` kept allocated in a run folder while its run is open."""

    def __init__(self, run_dir: pathlib.Path) -> None:
        self.path = run_dir / RESERVE_FILE

    def keep(self) -> None:
        """Allocate the reserve unless it is there (best effort: without space or ``posix_fallocate``, nothing)."""
        if self.path.exists():
            return
        try:
            with open(self.path, "wb") as handle:  # mode 0666 less the umask, as every file of the store
                os.posix_fallocate(handle.fileno(), 0, RESERVE_BYTES)
        except (OSError, AttributeError) as error:  # the failure path still tries without it
            LOG.debug("%s: no space reserve (%s)", self.path.parent, error)
            with contextlib.suppress(OSError):
                self.path.unlink()

    def release(self) -> bool:
        """Delete the reserve, giving its blocks back; whether there was one."""
        existed = self.path.exists()
        self.path.unlink(missing_ok=True)
        return existed


def write_status(run_dir: pathlib.Path, status: Mapping[str, Any], reserve: SpaceReserve) -> None:
    """Write ``status.json``: a ``failed`` or ``interrupted`` one however full the disk."""
    path = run_dir / STATUS_FILE
    if status["state"] in (FAILED, INTERRUPTED):
        write_despite_full_disk(path, status, reserve)
        return
    atomic_write_json(path, status)
    if status["state"] == RUNNING:
        reserve.keep()


def write_despite_full_disk(path: pathlib.Path, status: Mapping[str, Any], reserve: SpaceReserve) -> None:
    """Write ``status`` to ``path``, each attempt needing less free space (docs/run_store.md); the last one writes
    over the old file's blocks."""
    if not (_written(path, status) or (reserve.release() and _written(path, status))
            or _written(path, shortened(status, SHORT_TRACEBACK_CHARS))):
        with open(path, "r+b" if path.exists() else "wb") as handle:
            handle.write(pretty_json(shortened(status, LAST_RESORT_CHARS)))
            handle.truncate()


def _written(path: pathlib.Path, status: Mapping[str, Any]) -> bool:
    try:
        atomic_write_json(path, status)
    except OSError as error:
        LOG.warning("%s: writing status %s failed (%s); trying again", path.parent, status["state"], error)
        return False
    return True


def shortened(status: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``status`` with its traceback and error cut to their last ``limit`` characters (the end names the cause)."""
    result = dict(status)
    for key in ("traceback", "error"):
        text = result.get(key)
        if isinstance(text, str) and len(text) > limit:
            result[key] = "...(cut)\n" + text[-limit:]
    return result
