"""One writer per run: an exclusive kernel lock on ``<run_dir>/.run.lock``, whose file names the holder's pid."""

from __future__ import annotations

import os
import pathlib

import filelock

from dataflex_rl.tracking.run_store.files import LOCK_FILE
from dataflex_rl.validation import ConfigError

# Enough for any pid; more means the file was not written by a RunLock.
_PID_BYTES = 64


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

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder's pid; never waits."""
        if self.held:
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
        try:
            with open(self.path, "rb") as handle:
                recorded = handle.read(_PID_BYTES)
        except OSError:
            return "unknown"
        return recorded.decode("ascii", "replace").strip() or "unknown"

    def release(self) -> None:
        if self.held:
            self._lock.release(force=True)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
