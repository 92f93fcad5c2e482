"""Launching a sweep's runs: :class:`SweepSession` (the folder's lock, ``sweep.json``, the invocation record, the
warm starts, the exit code) and :class:`SweepRunner` (at most ``jobs`` runs at once through a launcher, resume, stop
signals), shared by the grid driver and the Optuna search; docs/sweeps.md describes resume and stopping."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.run_store import (COMPLETED, FAILED, INTERRUPTED, PENDING, RUNNING, RunLock, RunLockedError,
                                          RunStore, run_record_files, utc_now)
from dataflex_rl.validation import ConfigError
from sweeps.backends import get_backend
from sweeps.launchers import Job, Launcher, Outcome, build_launcher, write_log_header
from sweeps.live_view import SweepView
from sweeps.manifest import Manifest
from sweeps.plan import LOG_FOLDER, PlannedRun, SweepPlan

EXIT_FAILED = 1
EXIT_REFUSED = 2
LOCK_FILE = ".sweep.lock"
INTERRUPTED_CODES = (130, 143, -signal.SIGINT, -signal.SIGTERM)


class SweepStopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def readable_status(run_dir: Path) -> dict[str, Any] | None:
    """The run store's status, None when it is missing or cannot be read."""
    try:
        return run_store.read_status(run_dir)
    except (OSError, ValueError):
        return None


def run_lock_holder(run_dir: Path) -> str | None:
    """The message naming the live process that holds ``run_dir``'s lock, or None."""
    if not (run_dir / run_store.LOCK_FILE).is_file():
        return None
    try:
        RunLock(run_dir).acquire().release()
    except RunLockedError as error:
        return str(error)
    return None


def mark_run_store(run_dir: Path, state: str, error: str, scheduler: bool = False) -> str | None:
    """Mark a run killed before writing its end ``state``; returns the holder's message if locked."""
    if readable_status(run_dir) is None:
        return run_lock_holder(run_dir)
    try:
        with RunLock(run_dir):
            status = readable_status(run_dir)
            if status is not None and (status.get("state") == RUNNING
                                       or (scheduler and status.get("state") == INTERRUPTED)):
                store = RunStore(run_dir)
                try:  # its status.json step may be older: a killed run writes no end
                    logged = store.last_logged_step()
                except (OSError, ValueError):
                    logged = None
                steps = [step for step in (status.get("step"), logged) if isinstance(step, int)]
                store.set_status(state, step=max(steps) if steps else None, error=error)
    except RunLockedError as holder:
        return str(holder)
    return None


def record_state(run_dir: Path, run_store_optional: bool, previous: dict[str, Any]) -> tuple[bool, list[str]]:
    """``(completed, reasons its record cannot be trusted)`` of a planned run's folder."""
    if not os.path.lexists(run_dir):
        return False, []
    if run_store_optional and run_dir.is_dir() and not run_dir.is_symlink() and not run_store.run_record_files(run_dir):
        return previous.get("state") == COMPLETED and previous.get("exit_code") == 0, []
    reasons = run_store.verify_run(run_dir)
    if run_dir.is_symlink() or not run_dir.is_dir():
        return False, reasons
    status = readable_status(run_dir)
    if not reasons:
        return (status or {}).get("state") == COMPLETED, []
    unreadable = status is None and run_store.STATUS_FILE in run_store.run_record_files(run_dir)
    claims = unreadable or (status or {}).get("state") == COMPLETED or previous.get("state") == COMPLETED
    return False, reasons if claims else []


def last_error(log: Path) -> str:
    """``: <the log's last "error: ..." line>`` (what the process said when it stopped), or ``""``."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    said = [line.split("error: ", 1)[1] for line in lines if "error: " in line]
    return f": {said[-1]}" if said else ""


class SweepRunner:
    def __init__(self, plan: SweepPlan, launcher: Launcher, manifest: Manifest) -> None:
        self.plan, self.launcher, self.manifest = plan, launcher, manifest
        self.view: SweepView | None = None
        self.stop_signal: int | None = None
        self._forced = False
        self._previous_handlers: dict[int, Any] = {}

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
        self._forced = self._forced or self.stop_signal is not None
        self.stop_signal = signum

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
        """All but the completed runs; ConfigError for untrusted records and runs alive elsewhere."""
        to_launch, untrusted = [], []
        run_store_optional = get_backend(self.plan.config.backend).run_store_optional
        for run in runs:
            previous = self.manifest.previous(run.name) or {}
            completed, reasons = record_state(run.run_dir, run_store_optional, previous)
            if reasons:
                where = run.run_dir
                action = (f"put the run's own folder at {where} (replace the link), or remove the link (what it points "
                          f"to stays) to run it again" if where.is_symlink() else
                          f"restore what was changed, or move {where} away (keep it if you need it) to run it again")
                untrusted.append(f"run {run.name} is not counted as completed, its record cannot be trusted: "
                                 f"{'; '.join(reasons)}; {action}")
                continue
            if completed:
                self._entry(run, state=COMPLETED, exit_code=previous.get("exit_code", 0), error=None)
                continue
            if previous.get("state") == RUNNING and self.launcher.still_running(previous.get("launch", {}), run):
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
            if (self.manifest.previous(run.name) or {}).get("state") == RUNNING:
                mark_run_store(run.run_dir, INTERRUPTED, "its sweep driver ended before the run did")
            self._entry(run, state=PENDING, exit_code=None, error=None)
        self.manifest.save()
        return to_launch

    def _start(self, runs: Sequence[PlannedRun], warm_start: bool = False) -> list[Job]:
        attempts = {run.name: int(self._entry(run, warm_start=warm_start).get("attempts", 0)) + 1 for run in runs}
        for run in runs:
            write_log_header(run.log_path, attempts[run.name], run.shell_line())
        try:
            for run in runs:  # written as each run starts: a refused or dry invocation writes none
                run.write_config_file()
            jobs = self.launcher.launch(runs)
        except Exception as error:  # noqa: BLE001  (a launch that fails is that run's failure, reported as such)
            for run in runs:
                self._entry(run, warm_start=warm_start, state=FAILED, exit_code=None, start=utc_now(),
                            end=utc_now(), error=f"launch failed: {error}")
            self.manifest.save()
            return []
        for job in jobs:
            self._entry(job.run, warm_start=warm_start, state=RUNNING, start=utc_now(), end=None, exit_code=None,
                        error=None, launch=job.info, attempts=attempts[job.run.name])
            print(f"started {job.run.name}  (log: {job.run.log_path})", flush=True)
            if self.view is not None:
                self.view.started(job.run.name, None if warm_start else job.run.run_dir, job.run.log_path,
                                  warm_start=warm_start, total=job.run.total_steps)
        self.manifest.save()
        return jobs

    def _finish(self, job: Job, outcome: Outcome, warm_start: bool = False) -> str:
        code = outcome.exit_code
        if code == 0 and outcome.error is None:
            state = COMPLETED
        elif self.stop_signal is not None or code in INTERRUPTED_CODES or outcome.interrupted:
            state = INTERRUPTED
        else:
            state = FAILED
        if outcome.error or not code:
            error = outcome.error or None
        elif code < 0:
            error = f"process ended by signal {signal.Signals(-code).name} (exit code {code})"
        else:
            error = f"process exited with code {code}"
        if not warm_start and state != COMPLETED:
            holder = mark_run_store(job.run.run_dir, state, error or state, scheduler=outcome.interrupted)
            if holder is not None:  # the run was refused: another live process writes it (its store is untouched)
                error = f"{error or state}: {holder}; its run store was left to that process"
        entry = self._entry(job.run, warm_start=warm_start)
        wall = float(entry.get("wall_time_s") or 0.0) + (time.monotonic() - job.started)
        self._entry(job.run, warm_start=warm_start, state=state, exit_code=code, end=utc_now(),
                    error=error, wall_time_s=round(wall, 3))
        self.manifest.save()
        print(f"{state} {job.run.name}" + (f": {error}" if error else ""), flush=True)
        if self.view is not None:
            self.view.finished(job.run.name, state)
        return state

    def run_all(self, runs: Sequence[PlannedRun], warm_start: bool = False,
                on_poll: Callable[[Sequence[Job]], bool] | None = None) -> dict[str, str]:
        """Each run's final state; raises SweepStopped after stopping the runs on a signal."""
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
                launched = {job.run.name for job in started}
                states.update({run.name: FAILED for run in batch if run.name not in launched})
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
        reason = self.launcher.waiting(job)
        if reason != job.waiting:
            if reason is not None:
                print(f"{job.run.name} waits in the queue: {reason}", flush=True)
            elif job.waiting is not None:
                print(f"{job.run.name} is running", flush=True)
            job.waiting = reason
        if self.view is not None:
            self.view.waiting(job.run.name, reason)

    def _stop(self, active: list[Job], warm_start: bool, states: dict[str, str],
              reason: str = INTERRUPTED) -> None:
        """SIGTERM every active run, wait up to ``grace_s`` (less after a second signal), then SIGKILL."""
        if active:
            print(f"{reason}: stopping {len(active)} run(s) (SIGTERM, SIGKILL after {self.plan.config.grace_s:g} s)",
                  flush=True)
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


class SessionRefused(Exception):
    pass


def remove_if_only_lock(sweep_dir: Path) -> None:
    """Remove a sweep folder a refused session made, when it holds nothing but the driver's lock file."""
    if sweep_dir.is_dir() and {path.name for path in sweep_dir.iterdir()} <= {LOCK_FILE}:
        with contextlib.suppress(OSError):
            (sweep_dir / LOCK_FILE).unlink(missing_ok=True)
            sweep_dir.rmdir()


class SweepSession:
    """Lock, manifest, invocation record, warm starts and exit code; nothing written when refused."""

    def __init__(self, plan: SweepPlan, argv: Sequence[str] = (), header: Mapping[str, Any] | None = None,
                 kind: str = "sweep") -> None:
        self.plan, self.argv, self.kind = plan, list(argv), kind
        self.header = dict(header) if header is not None else plan.header()
        self.exit_code = 0
        self.launcher: Launcher | None = None
        self.manifest: Manifest | None = None
        self.runner: SweepRunner | None = None

    def __enter__(self) -> Self:
        from filelock import FileLock, Timeout

        plan, kind = self.plan, self.kind
        found = run_record_files(plan.sweep_dir)
        if found:
            raise SessionRefused(
                f"{kind} refused, nothing was started: {plan.sweep_dir} holds a run store ({', '.join(found)}: one "
                f"run's folder, as python -m dataflex_rl.local.train writes it), not a {kind} folder; a {kind} keeps one run "
                f"folder per run inside its own folder: give the {kind} another name ("
                f"{'make sweep SWEEP=<new name>, ' if kind == 'sweep' else ''}name=<new name>), or move the run away")
        with contextlib.ExitStack() as refused:  # undoes what was done when the session is refused
            try:
                self.launcher = build_launcher(plan.config, plan.sweep_dir, plan.name, plan.jobs)
                refused.callback(self.launcher.close)
                if not plan.sweep_dir.is_dir():
                    refused.callback(remove_if_only_lock, plan.sweep_dir)
                plan.sweep_dir.mkdir(parents=True, exist_ok=True)
                self._lock = FileLock(plan.sweep_dir / LOCK_FILE)
                self._lock.acquire(timeout=0)
                refused.callback(self._lock.release)
                self.manifest = Manifest(plan.sweep_dir, self.header)
            except Timeout:
                raise SessionRefused(f"{kind} {plan.name} is being run by another driver (lock "
                                     f"{self._lock.lock_file})") from None
            except ConfigError as error:
                raise SessionRefused(f"{kind} refused, nothing was started: {error}") from None
            except (OSError, UnicodeError) as error:
                raise SessionRefused(f"{kind} refused, nothing was started: its folder {plan.sweep_dir} cannot be "
                                     f"written ({error.strerror or error}); give a writable root=<folder> "
                                     f"(make sweep SWEEP_ARGS=\"root=<folder>\")") from None
            refused.pop_all()
        self.manifest.begin_invocation(self.argv)
        self.runner = SweepRunner(plan, self.launcher, self.manifest).__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.runner.__exit__(exc_type, exc, tb)
            if exc_type is None or not issubclass(exc_type, ConfigError):  # a refusal writes nothing
                if exc_type is not None:  # a crash: the record never stays "running"
                    self.exit_code = self.exit_code or EXIT_FAILED
                self.manifest.end_invocation(self.exit_code)
        finally:
            self._lock.release()

    def run(self, body: Callable[[SweepRunner], int]) -> int:
        """``body(runner)``'s exit status (``128 + signal`` when stopped)."""
        try:
            code = body(self.runner)
        except SweepStopped as stopped:
            code = 128 + stopped.signum
        if code:
            self.exit_code = code
        return self.exit_code

    def warm_start(self, launching: Sequence[PlannedRun] | None = None) -> bool:
        """The warm starts of the runs ``launching`` (default: of every run; a completed run's is never rebuilt);
        False (error printed, exit code EXIT_FAILED) when one failed."""
        names = None if launching is None else {run.name for run in launching}
        warm_starts = [run for run in self.plan.warm_starts
                       if names is None or not run.serves or names & set(run.serves)]
        if not warm_starts:
            return True
        names = ", ".join(run.name for run in warm_starts)
        shared_by = "every run of its seed" if self.plan.config.warm_start == "per_seed" else "every run"
        print(f"warm start {names} (once each, shared by {shared_by}; warm_start={self.plan.config.warm_start})",
              flush=True)
        states = self.runner.run_all(warm_starts, warm_start=True)
        failed = [name for name, state in states.items() if state != COMPLETED]
        if failed:
            log = self.plan.sweep_dir / LOG_FOLDER / f"{failed[0]}.log"
            print(f"error: the warm start {failed[0]} failed{last_error(log)}; see {log}", file=sys.stderr)
            self.exit_code = self.exit_code or EXIT_FAILED
            return False
        return True

    def run_grid(self, concurrency_note: str) -> int:
        plan = self.plan
        to_launch = self.runner.pending_runs(plan.runs)
        skipped = len(plan.runs) - len(to_launch)
        print(f"sweep {plan.name}: {len(plan.runs)} run(s) ({skipped} already completed), {concurrency_note}; "
              f"folder {plan.sweep_dir}", flush=True)

        def body(runner: SweepRunner) -> int:
            if to_launch and not self.warm_start(to_launch):
                return EXIT_FAILED
            return EXIT_FAILED if any(state != COMPLETED for state in runner.run_all(to_launch).values()) else 0

        self.runner.view = SweepView(total=len(plan.runs), done_before=skipped, jobs=plan.jobs)
        with self.runner.view:
            return self.run(body)
