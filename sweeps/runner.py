"""The scheduling loop shared by the grid driver (:mod:`sweeps.driver`) and the Optuna search (:mod:`sweeps.tune`).

:class:`SweepRunner` launches planned runs through a launcher, at most ``jobs`` at once, keeping ``sweep.json``
current, for a :class:`sweeps.commands.SweepPlan`.

Resume: a run whose ``status.json`` says ``completed`` and whose record passes the run store's check
(:func:`~dataflex_rl.tracking.run_store.verify_run`) is skipped; a deleted run folder is pending again; a run whose
record claims completion but fails the check is refused, naming the run, the reasons and what to do; any other is
launched again with the same command, and the trainer resumes it from its last checkpoint. SIGINT/SIGTERM to the driver stop it cleanly: each
running run gets SIGTERM (it marks itself interrupted and keeps its checkpoint), SIGKILL after ``grace_s``; a second
signal skips the grace period.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from dataflex_rl.validation import ConfigError
from sweeps.commands import PlannedRun, SweepPlan
from sweeps.launchers import Job, Launcher, Outcome, write_log_header
from sweeps.manifest import Manifest, utc_now
from sweeps.progress import SweepView

EXIT_FAILED = 1
EXIT_REFUSED = 2
INTERRUPTED_CODES = (130, 143, -signal.SIGINT, -signal.SIGTERM)


class SweepStopped(Exception):
    """The driver got SIGINT/SIGTERM; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# --- run store helpers ---------------------------------------------------------------------------------------------
def read_status(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``status.json`` through the run store's reader; None when absent or damaged."""
    from dataflex_rl.tracking import run_store

    try:
        return run_store.read_status(run_dir)
    except (OSError, ValueError):
        return None


def run_lock_holder(run_dir: Path) -> str | None:
    """Who writes ``run_dir`` now: the run store's message naming the live process holding its lock (its pid), or
    None when no process does (nothing is created for a run folder that does not exist)."""
    from dataflex_rl.tracking.run_store import LOCK_FILE, RunLock, RunLockedError

    if not (run_dir / LOCK_FILE).is_file():
        return None
    try:
        RunLock(run_dir).acquire().release()
    except RunLockedError as error:
        return str(error)
    return None


def mark_run_store(run_dir: Path, state: str, error: str, scheduler: bool = False) -> str | None:
    """After the process is gone: turn a ``running`` status.json (the run could not write its own end, e.g. after
    SIGKILL) into ``state`` with ``error``, so the run store never claims a dead run is running. ``scheduler``: the
    error is a scheduler's account of the stop (scancel, time limit), which also replaces the reason an
    ``interrupted`` run gave itself (the signal it received).

    Written under the run's lock: a run store whose lock another live process holds is that process's, and is left
    alone; the holder's message (naming its pid) is returned then, else None."""
    from dataflex_rl.tracking.run_store import RunLock, RunLockedError, RunStore

    if read_status(run_dir) is None:
        return run_lock_holder(run_dir)
    try:
        lock = RunLock(run_dir).acquire()
    except RunLockedError as holder:
        return str(holder)
    try:
        status = read_status(run_dir)
        if status is not None and (status.get("state") == "running"
                                   or (scheduler and status.get("state") == "interrupted")):
            store = RunStore(run_dir)
            steps = [step for step in (status.get("step"), _last_logged_step(store)) if isinstance(step, int)]
            store.set_status(state, step=max(steps) if steps else None, error=error)
    finally:
        lock.release()
    return None


def _last_logged_step(store: Any) -> int | None:
    """The last step a run logged (its ``status.json`` step may be older: a killed run writes no end)."""
    try:
        return store.last_logged_step()
    except (OSError, ValueError):
        return None


def record_state(run_dir: Path, backend: str, previous: dict[str, Any]) -> tuple[bool, list[str]]:
    """``(completed, reasons)`` of a planned run's folder: whether it counts as completed, and why its record cannot
    be trusted (the run store's :func:`~dataflex_rl.tracking.run_store.verify_run`) when it claims or may claim to
    be completed (its ``status.json`` or ``sweep.json`` entry says so, or its status cannot be read).

    No folder: not completed (deleted, or never started), whatever ``sweep.json`` says. A verl run whose folder holds
    no run store at all (verl wrote only its checkpoints there): ``sweep.json``'s completed state with exit code 0
    decides. A run that is not completed by any account is resumed by its trainer, which checks its record itself.
    """
    from dataflex_rl.tracking import run_store
    from dataflex_rl.tracking.run_store.verify import VERL_BACKEND

    if not os.path.lexists(run_dir):
        return False, []
    recorded_completed = previous.get("state") == "completed" and previous.get("exit_code") == 0
    if (backend == VERL_BACKEND and run_dir.is_dir() and not run_dir.is_symlink()
            and not run_store.run_record_files(run_dir)):
        return recorded_completed, []
    reasons = run_store.verify_run(run_dir)
    if run_dir.is_symlink() or not run_dir.is_dir():
        return False, reasons
    status = read_status(run_dir)
    if not reasons:
        return (status or {}).get("state") == "completed", []
    unreadable_status = status is None and run_store.STATUS_FILE in run_store.run_record_files(run_dir)
    claims = (unreadable_status or (status or {}).get("state") == "completed"
              or previous.get("state") == "completed")
    return False, reasons if claims else []


def untrusted_message(name: str, run_dir: Path, reasons: list[str]) -> str:
    """What the sweep says of a run whose record cannot be trusted: the run, the reasons, what to do."""
    if run_dir.is_symlink():
        action = (f"put the run's own folder at {run_dir} (replace the link), or remove the link (what it points to "
                  f"stays) to run it again")
    else:
        action = (f"restore what was changed, or move {run_dir} away (keep it if you need it) to run it again")
    return f"run {name} is not counted as completed, its record cannot be trusted: {'; '.join(reasons)}; {action}"


def describe_exit(outcome: Outcome) -> str | None:
    """The error recorded for a run's end: the launcher's message, the killing signal or the exit code; None
    for a clean exit."""
    if outcome.error:
        return outcome.error
    code = outcome.exit_code
    if code is None or code == 0:
        return None
    if code < 0:
        return f"process ended by signal {signal.Signals(-code).name} (exit code {code})"
    return f"process exited with code {code}"


# --- scheduling ----------------------------------------------------------------------------------------------------
class SweepRunner:
    """Launches planned runs through a launcher, at most ``jobs`` at once, keeping sweep.json current.

    ``on_poll(active_runs)`` (optional) is called every poll; returning True stops the active runs and ends
    :meth:`run_all` early (the Optuna driver prunes this way).
    """

    def __init__(self, plan: SweepPlan, launcher: Launcher, manifest: Manifest, quiet: bool = False,
                 view: SweepView | None = None) -> None:
        self.plan = plan
        self.view = view
        self.launcher = launcher
        self.manifest = manifest
        self.quiet = quiet
        self.stop_signal: int | None = None
        self._forced = False
        self._previous_handlers: dict[int, Any] = {}

    # signals
    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        self.launcher.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stop_signal is not None:
            self._forced = True
        self.stop_signal = signum

    def say(self, text: str) -> None:
        """Print one progress line (unless ``quiet``)."""
        if not self.quiet:
            print(text, flush=True)

    # entries
    def _entry(self, run: PlannedRun, warm_start: bool = False, **fields: Any) -> dict[str, Any]:
        base = {"log": str(run.log_path.relative_to(self.plan.sweep_dir.resolve())),
                "command": list(run.command), "env": dict(run.env)}
        if run.config_file is not None:  # the command reads the config: the overrides it was composed from
            base["overrides"] = list(run.overrides)
        if not warm_start:
            base.update(run.spec.describe(), backend=self.plan.config.backend,
                        run_dir=str(run.run_dir.relative_to(self.plan.sweep_dir.resolve())))
        return self.manifest.entry(run.name, {**base, **fields}, warm_start=warm_start)

    def pending_runs(self, runs: Sequence[PlannedRun]) -> list[PlannedRun]:
        """Runs to launch: all but the completed ones (:func:`record_state`). Refuses (:class:`ConfigError`, before
        sweep.json is written) runs whose record claims completion but cannot be trusted, naming each with its
        reasons, and runs still alive from an earlier invocation."""
        to_launch, untrusted = [], []
        for run in runs:
            previous = self.manifest.previous(run.name) or {}
            completed, reasons = record_state(run.run_dir, self.plan.config.backend, previous)
            if reasons:
                untrusted.append(untrusted_message(run.name, run.run_dir, reasons))
                continue
            if completed:
                self._entry(run, state="completed", exit_code=previous.get("exit_code", 0),
                            error=None)
                continue
            if previous.get("state") == "running":
                if self.launcher.still_running(previous.get("launch", {}), run):
                    raise ConfigError(f"run {run.name} is still running from an earlier invocation "
                                      f"({previous.get('launch')}); stop it or wait for it before resuming the sweep")
            holder = run_lock_holder(run.run_dir)
            if holder is not None:
                raise ConfigError(f"run {run.name}: {holder} (started outside this sweep's driver); the sweep "
                                  f"leaves its run store to that process: resume the sweep after it ends")
            to_launch.append(run)
        if untrusted:
            raise ConfigError("sweep refused, nothing was started: " + "\n  ".join(untrusted))
        for run in to_launch:
            if (self.manifest.previous(run.name) or {}).get("state") == "running":
                mark_run_store(run.run_dir, "interrupted", "its sweep driver ended before the run did")
            self._entry(run, state="pending", exit_code=None, error=None)
        self.manifest.save()
        return to_launch

    def _start(self, runs: Sequence[PlannedRun], warm_start: bool = False) -> list[Job]:
        for run in runs:
            entry = self._entry(run, warm_start=warm_start)
            attempt = int(entry.get("attempts", 0)) + 1
            write_log_header(run.log_path, attempt, run.shell_line())
        try:
            for run in runs:  # written as each run starts: a refused or dry invocation writes none
                run.write_config_file()
            jobs = self.launcher.launch(runs)
        except Exception as error:  # noqa: BLE001  (a launch that fails is that run's failure, reported as such)
            for run in runs:
                self._entry(run, warm_start=warm_start, state="failed", exit_code=None, start=utc_now(),
                            end=utc_now(), error=f"launch failed: {error}")
            self.manifest.save()
            return []
        for job in jobs:
            entry = self._entry(job.run, warm_start=warm_start)
            self._entry(job.run, warm_start=warm_start, state="running", start=utc_now(), end=None, exit_code=None,
                        error=None, launch=job.info, attempts=int(entry.get("attempts", 0)) + 1)
            self.say(f"started {job.run.name}  (log: {job.run.log_path})")
            if self.view is not None:
                self.view.started(job.run.name, None if warm_start else job.run.run_dir, job.run.log_path,
                                  warm_start=warm_start, total=job.run.total_steps)
        self.manifest.save()
        return jobs

    def _finish(self, job: Job, outcome: Outcome, warm_start: bool = False) -> str:
        if outcome.exit_code == 0 and outcome.error is None:
            state = "completed"
        elif self.stop_signal is not None or outcome.exit_code in INTERRUPTED_CODES or outcome.interrupted:
            state = "interrupted"
        else:
            state = "failed"
        error = describe_exit(outcome)
        if not warm_start and state != "completed":
            holder = mark_run_store(job.run.run_dir, state, error or state, scheduler=outcome.interrupted)
            if holder is not None:  # the run was refused: another live process writes it (its store is untouched)
                error = f"{error or state}: {holder}; its run store was left to that process"
        entry = self._entry(job.run, warm_start=warm_start)
        wall = float(entry.get("wall_time_s") or 0.0) + (time.monotonic() - job.started)
        self._entry(job.run, warm_start=warm_start, state=state, exit_code=outcome.exit_code, end=utc_now(),
                    error=error, wall_time_s=round(wall, 3))
        self.manifest.save()
        self.say(f"{state} {job.run.name}" + (f": {error}" if error else ""))
        if self.view is not None:
            self.view.finished(job.run.name, state)
        return state

    def run_all(self, runs: Sequence[PlannedRun], warm_start: bool = False,
                on_poll: Callable[[Sequence[Job]], bool] | None = None) -> dict[str, str]:
        """Run ``runs`` to their end (or until stopped); return each run's final state. Raises :class:`SweepStopped`
        after stopping the active runs when the driver got a signal."""
        queue = deque(runs)
        active: list[Job] = []
        states: dict[str, str] = {}
        limit = len(runs) if self.launcher.batch else max(1, self.plan.jobs)
        while queue or active:
            if self.stop_signal is not None:
                self._stop(active, warm_start, states)
                raise SweepStopped(self.stop_signal)
            if queue and len(active) < limit:
                batch = [queue.popleft() for _ in range(min(len(queue), limit - len(active)))]
                started = self._start(batch, warm_start)
                active += started
                for run in batch:
                    if run.name not in {job.run.name for job in started}:
                        states[run.name] = "failed"
            for job in list(active):
                outcome = self.launcher.poll(job)
                if outcome is not None:
                    active.remove(job)
                    states[job.run.name] = self._finish(job, outcome, warm_start)
                else:
                    self._show_waiting(job)
            if on_poll is not None and active and on_poll(active):
                self._stop(active, warm_start, states, reason="stopped by the driver")
                return states
            if self.view is not None:
                self.view.refresh()
            time.sleep(self.plan.config.poll_s)
        return states

    def _show_waiting(self, job: Job) -> None:
        """Say once, each time it changes, why a launched run waits (a scheduler's queue reason)."""
        reason = self.launcher.waiting(job)
        if reason != job.waiting:
            if reason is not None:
                self.say(f"{job.run.name} waits in the queue: {reason}")
            elif job.waiting is not None:
                self.say(f"{job.run.name} is running")
            job.waiting = reason
        if self.view is not None:
            self.view.waiting(job.run.name, reason)

    def _stop(self, active: list[Job], warm_start: bool, states: dict[str, str],
              reason: str = "interrupted") -> None:
        """SIGTERM every active run, wait up to ``grace_s`` (less after a second signal), then SIGKILL."""
        if active:
            self.say(f"{reason}: stopping {len(active)} run(s) (SIGTERM, SIGKILL after {self.plan.config.grace_s:g} s)")
        for job in active:
            self.launcher.terminate(job)
        deadline = time.monotonic() + self.plan.config.grace_s
        killed = False
        while active:
            if not killed and (self._forced or time.monotonic() > deadline):
                for job in active:
                    self.launcher.kill(job)
                killed = True
            for job in list(active):
                outcome = self.launcher.poll(job)
                if outcome is not None:
                    active.remove(job)
                    if self.stop_signal is None:  # pruning: an early stop is an interruption, not a failure
                        outcome = Outcome(outcome.exit_code if outcome.exit_code == 0 else 130, outcome.error)
                    states[job.run.name] = self._finish(job, outcome, warm_start)
            time.sleep(min(0.1, self.plan.config.poll_s))
