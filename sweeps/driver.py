"""One sweep invocation: plan it, run it in a session, print and write what it ended with.

:func:`run_sweep` is what ``python -m sweeps`` does: expand and validate the grid (a bad value refuses the whole
sweep before anything starts), print the command lines (``dry_run``) or run them in a :class:`SweepSession`, then
print the summary table and write the report. The scheduling loop is :class:`sweeps.runner.SweepRunner`; resume and
stop signals are described there.

A :class:`SweepSession` is one invocation over one sweep folder, shared by the grid driver and the Optuna search:
refuse a folder that holds a run store (a run's folder, not a sweep's), build the launcher, take the folder's lock
(a second driver on the same folder is refused), open ``sweep.json`` (refused when its recorded settings differ),
append this invocation's record (argv, start, end, exit code), run the shared warm starts once, turn a stop signal
into the exit code ``128 + signal`` and, on a normal exit, record the sweep's state and the invocation's end.
Nothing is written when the session is refused (:class:`SessionRefused`, exit status 2)::

    with SweepSession(plan, argv) as session:
        session.run(lambda runner: ...)   # returns an exit status; SweepStopped -> 128 + signal
    session.exit_code

Imports point one way: the driver imports ``planning`` lazily (a seed plan runs the driver's invocation through a
callback, so planning needs nothing of the driver), ``runner`` and ``progress``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from dataflex_rl.validation import ConfigError
from sweeps.backends import backend_for, plan_runs, plan_warm_starts
from sweeps.config import SINGLE_RUN_THREADS, SweepConfig, available_cores
from sweeps.grid import default_name, expand_grid
from sweeps.launchers import Launcher, build_launcher, launcher_class
from sweeps.manifest import Manifest
from sweeps.progress import SweepView, print_dry_run, print_summary, thread_note, write_exports, write_report
from sweeps.commands import PlannedRun, SweepPlan
from sweeps.runner import EXIT_FAILED, EXIT_REFUSED, SweepRunner, SweepStopped

LOCK_FILE = ".sweep.lock"


class SessionRefused(Exception):
    """The session could not start and nothing was started; ``str()`` is the message to print after "error: "."""




def check_not_a_run_store(sweep_dir: Path, kind: str = "sweep") -> None:
    """Refuse (:class:`SessionRefused`, before anything is written) a sweep folder that holds a run store at its
    top: the sweep would write its runs, record and tables into one run's folder."""
    from dataflex_rl.tracking.run_store import run_record_files

    found = run_record_files(sweep_dir)
    if found:
        raise SessionRefused(
            f"{kind} refused, nothing was started: {sweep_dir} holds a run store ({', '.join(found)}: one run's "
            f"folder, as python -m dataflex_rl.train writes it), not a {kind} folder; a {kind} keeps one run folder "
            f"per run inside its own folder: give the {kind} another name ("
            f"{'make sweep SWEEP=<new name>, ' if kind == 'sweep' else ''}name=<new name>), or move the run away")


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
        check_not_a_run_store(plan.sweep_dir, self.kind)
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
        self.manifest.begin_invocation(self.argv)
        self.runner = SweepRunner(plan, self.launcher, self.manifest).__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self.runner.__exit__(exc_type, exc, tb)
            if exc_type is None:
                self.manifest.end_invocation(self.exit_code)
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
        shared_by = ("every run of its seed" if self.plan.config.warm_start == "per_seed"
                     else "every run")
        print(f"warm start {names} (once each, shared by {shared_by}; warm_start={self.plan.config.warm_start})",
              flush=True)
        states = self.runner.run_all(self.plan.warm_starts, warm_start=True)
        failed = [name for name, state in states.items() if state != "completed"]
        if failed:
            print(f"error: the warm start {failed[0]} failed; see {self.plan.sweep_dir / 'logs' / (failed[0] + '.log')}",
                  file=sys.stderr)
            self.exit_code = self.exit_code or EXIT_FAILED
            return False
        return True



# --- the grid driver ---------------------------------------------------------------------------------------------
def concurrency(config: SweepConfig, runs: int) -> tuple[int, int | None]:
    """(runs at once, torch threads per run).

    A launcher whose runs share this machine (``process``): ``jobs`` defaults to the core count, at most the number
    of runs; any other (slurm, ray): to every run. Threads per run come from the launcher's settings when it has
    them (slurm: ``slurm.cpus_per_task``, each job owns its CPUs), else default to 1 whenever more than one run can
    be live (several 1-thread runs side by side beat multi-thread runs on this model size, and never oversubscribe)
    and to :data:`SINGLE_RUN_THREADS` (measured by ``benchmarks/bench_local.py``) for a lone run; verl runs set no
    thread count. ``threads=N`` always wins. A backend may ask for fewer runs here (:meth:`Backend.jobs_here`:
    verl's CPU mode, one at a time).
    """
    launcher = launcher_class(config.launcher)
    here = backend_for(config).jobs_here(config) if launcher.runs_here and not config.jobs else None
    jobs = config.jobs or max(1, min(here[0] if here else available_cores(), runs) if launcher.runs_here else runs)
    threads: int | None = (config.threads or launcher.threads_per_run(config.launcher_settings)
                           or (1 if jobs > 1 else SINGLE_RUN_THREADS))
    if not backend_for(config).sets_threads:
        threads = None
    return jobs, threads


def jobs_note(config: SweepConfig) -> str:
    """`` (why)`` when the backend chose the number of runs at once (:meth:`Backend.jobs_here`), else empty."""
    here = None if config.jobs or not launcher_class(config.launcher).runs_here else backend_for(config).jobs_here(config)
    return f" ({here[1]}; jobs=N to change)" if here else ""


def warm_start_threads(config: SweepConfig, threads: int | None) -> int | None:
    """Threads of the warm start, which runs alone before the runs: a lone run's count on this machine, the
    runs' own count elsewhere; ``threads=N`` wins."""
    return config.threads or (SINGLE_RUN_THREADS if launcher_class(config.launcher).runs_here else threads)


def plan_sweep(config: SweepConfig, name: str | None = None) -> SweepPlan:
    """Expand and validate the whole grid; raises :class:`ConfigError` naming the first bad value."""
    name = name or config.name or default_name(config)
    sweep_dir = Path(config.root) / name
    specs = expand_grid(config)
    jobs, threads = concurrency(config, len(specs))
    backend_for(config).check_machine(config)
    runs = plan_runs(config, specs, name, sweep_dir, threads)  # validates every run's config first
    return SweepPlan(name=name, sweep_dir=sweep_dir, config=config, jobs=jobs, threads=threads,
                     warm_starts=plan_warm_starts(config, specs, sweep_dir, warm_start_threads(config, threads)),
                     runs=runs, common_config=backend_for(config).common_config(config))


def run_sweep(config: SweepConfig, argv: Sequence[str] = ()) -> int:
    """The whole sweep; returns the exit status (0 all completed, 1 a run failed, 2 refused, 128+n stopped).

    With ``target_mde``: a pilot on the given seeds, then the seeds planned from it (:mod:`sweeps.planning`).
    """
    if config.target_mde is not None and not config.dry_run:
        from sweeps.planning import run_planned_sweep

        return run_planned_sweep(config, argv, _run_sweep_once)
    return _run_sweep_once(config, argv)


def _run_sweep_once(config: SweepConfig, argv: Sequence[str] = ()) -> int:
    """One invocation over the configured seeds (see :func:`run_sweep`)."""
    try:
        plan = plan_sweep(config)
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if config.dry_run:
        print_dry_run(plan)
        return 0
    try:
        with SweepSession(plan, argv, kind="sweep") as session:
            to_launch = session.runner.pending_runs(plan.runs)
            skipped = len(plan.runs) - len(to_launch)
            print(f"sweep {plan.name}: {len(plan.runs)} run(s) ({skipped} already completed), {plan.jobs} at "
                  f"once{jobs_note(plan.config)}, {thread_note(plan)}; folder {plan.sweep_dir}", flush=True)
            session.runner.view = SweepView(total=len(plan.runs), done_before=skipped, jobs=plan.jobs)
            with session.runner.view:
                session.run(lambda runner: _run_runs(session, to_launch))
    except (SessionRefused, ConfigError) as error:  # ConfigError: a run still alive from an earlier driver
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    return _finish(plan, session)


def _run_runs(session: SweepSession, to_launch: list[PlannedRun]) -> int:
    """The warm start (only when a run is left to launch), then the runs: 0, or EXIT_FAILED when one failed."""
    if to_launch and not session.warm_start():
        return EXIT_FAILED
    states = session.runner.run_all(to_launch)
    return EXIT_FAILED if any(state != "completed" for state in states.values()) else 0


def _finish(plan: SweepPlan, session: SweepSession) -> int:
    """After the session: the summary tables, then the report (or the sweep tables); returns the exit status."""
    exit_code, manifest = session.exit_code, session.manifest
    print_summary(plan, manifest)
    if plan.config.report and exit_code <= 128 and any(
            (manifest.previous(run.name) or {}).get("state") == "completed" for run in plan.runs):
        failed, message = write_report(plan.sweep_dir)
        print(message, flush=True)
        if failed and not exit_code:
            exit_code = EXIT_FAILED
    elif exit_code <= 128:
        print(write_exports(plan.sweep_dir), flush=True)
    print(f"sweep folder: {plan.sweep_dir}  (sweep.json, launch/, logs/, one run store per run)", flush=True)
    return exit_code
