"""One sweep invocation over one sweep folder, shared by the grid driver and the Optuna search.

A :class:`SweepSession` owns what both drivers did alike: build the launcher, take the folder's lock (a second
driver on the same folder is refused), open ``sweep.json`` (refused when its recorded settings differ), append this
invocation's record (argv, start, end, exit code), run the shared warm starts once, turn a stop signal into the exit
code ``128 + signal`` and, on a normal exit, record the sweep's state and the invocation's end. Nothing is written
when the session is refused (:class:`SessionRefused`, exit status 2).

    with SweepSession(plan, argv) as session:
        session.run(lambda runner: ...)   # returns an exit status; SweepStopped -> 128 + signal
    session.exit_code
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from dataflex_rl.validation import ConfigError
from sweeps.launchers import Launcher, build_launcher
from sweeps.manifest import Manifest, utc_now
from sweeps.runner import EXIT_FAILED, SweepPlan, SweepRunner, SweepStopped

LOCK_FILE = ".sweep.lock"


class SessionRefused(Exception):
    """The session could not start and nothing was started; ``str()`` is the message to print after "error: "."""


def final_state(exit_code: int) -> str:
    """The sweep's recorded state after an invocation that ended with ``exit_code``."""
    return "interrupted" if exit_code > 128 else "failed" if exit_code else "completed"


class SweepSession:
    """Lock, manifest, invocation record, warm starts and exit code of one invocation (see the module doc).

    ``kind`` names the thing in messages ("sweep", "study"); ``header`` is sweep.json's header (default: the
    plan's own).
    """

    def __init__(self, plan: SweepPlan, argv: Sequence[str] = (), header: Mapping[str, Any] | None = None,
                 kind: str = "sweep") -> None:
        self.plan = plan
        self.argv = list(argv)
        self.kind = kind
        self.header = dict(header) if header is not None else plan.header()
        self.exit_code = 0
        self.launcher: Launcher | None = None
        self.manifest: Manifest | None = None
        self.runner: SweepRunner | None = None
        self._lock: Any = None
        self._invocation: dict[str, Any] = {}

    def _refused(self, error: Exception) -> SessionRefused:
        return SessionRefused(f"{self.kind} refused, nothing was started: {error}")

    def _acquire_lock(self) -> Any:
        """The folder's lock, taken without waiting; :class:`SessionRefused` when another driver holds it."""
        from filelock import FileLock, Timeout

        self.plan.sweep_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.plan.sweep_dir / LOCK_FILE)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            raise SessionRefused(f"{self.kind} {self.plan.name} is being run by another driver "
                                 f"(lock {lock.lock_file})") from None
        return lock

    def __enter__(self) -> Self:
        plan = self.plan
        try:
            self.launcher = build_launcher(plan.config, plan.sweep_dir, plan.name, plan.jobs)
        except ConfigError as error:
            raise self._refused(error) from None
        try:
            self._lock = self._acquire_lock()
        except SessionRefused:
            self.launcher.close()
            raise
        try:
            self.manifest = Manifest(plan.sweep_dir, self.header)
        except ConfigError as error:
            self._lock.release()
            self.launcher.close()
            raise self._refused(error) from None
        self._invocation = {"argv": self.argv, "start": utc_now(), "end": None, "exit_code": None}
        self.manifest.data["invocations"].append(self._invocation)
        self.runner = SweepRunner(plan, self.launcher, self.manifest).__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.runner.__exit__(exc_type, exc, tb)
            if exc_type is None:
                self.record_end()
        finally:
            self._lock.release()

    def run(self, body: Callable[[SweepRunner], int]) -> int:
        """``body(runner)``'s exit status, or ``128 + signal`` when the driver was stopped; a non-zero status becomes
        the session's exit code (an earlier failure is never replaced by 0)."""
        try:
            code = body(self.runner)
        except SweepStopped as stopped:
            code = 128 + stopped.signum
        if code:
            self.exit_code = code
        return self.exit_code

    def warm_start(self) -> bool:
        """Run the plan's shared warm starts (the SFT checkpoint); False, with the error printed and the exit code
        set to :data:`EXIT_FAILED`, when one failed. Raises :class:`SweepStopped` on a stop signal."""
        if not self.plan.warm_starts:
            return True
        names = ", ".join(run.name for run in self.plan.warm_starts)
        print(f"warm start {names} (once, shared by every run)", flush=True)
        states = self.runner.run_all(self.plan.warm_starts, warm_start=True)
        failed = [name for name, state in states.items() if state != "completed"]
        if failed:
            print(f"error: the warm start {failed[0]} failed; see {self.plan.sweep_dir / 'logs' / (failed[0] + '.log')}",
                  file=sys.stderr)
            self.exit_code = self.exit_code or EXIT_FAILED
            return False
        return True

    def record_end(self) -> None:
        """Write the sweep's state and this invocation's end and exit code into sweep.json."""
        self.manifest.data["state"] = final_state(self.exit_code)
        self._invocation.update(end=utc_now(), exit_code=self.exit_code)
        self.manifest.save()
