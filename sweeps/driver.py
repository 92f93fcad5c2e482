"""Run a planned sweep: warm start once, then every run in its own process, at most ``jobs`` at once.

:func:`run_sweep` is what ``python -m sweeps`` does: expand and validate the grid (a bad value refuses the whole
sweep before anything starts), print the command lines (``dry_run``) or run them, then print the summary table and
write the report. :class:`SweepRunner` is the scheduling loop, shared with the Optuna driver.

Resume: a run whose ``status.json`` says ``completed`` is skipped; any other is launched again with the same
command, and the trainer resumes it from its last checkpoint. SIGINT/SIGTERM to the driver stop it cleanly: each
running run gets SIGTERM (it marks itself interrupted and keeps its checkpoint), SIGKILL after ``grace_s``; a second
signal skips the grace period.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from dataflex_rl.validation import ConfigError
from sweeps.backends import backend_for, plan_runs, plan_warm_starts
from sweeps.commands import PlannedRun
from sweeps.config import SINGLE_RUN_THREADS, SweepConfig, available_cores
from sweeps.grid import RunSpec, expand_grid, grid_description
from sweeps.launchers import Job, Launcher, Outcome, build_launcher, write_log_header
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


@dataclasses.dataclass
class SweepPlan:
    """Everything a sweep will do, fixed before the first process starts."""

    name: str
    sweep_dir: Path
    config: SweepConfig
    jobs: int
    threads: int | None
    warm_starts: list[PlannedRun]
    runs: list[PlannedRun]

    def header(self) -> dict[str, Any]:
        return {"sweep": self.name, "backend": self.config.backend, "launcher": self.config.launcher,
                "grid": grid_description(self.config), "steps": self.config.steps, "jobs": self.jobs,
                "threads": self.threads, "train_module": self.config.train_module}


def default_name(config: SweepConfig, prefix: str = "sweep") -> str:
    """``<prefix>-<8 hex>``: the hash covers the grid and the overrides, so the same command finds (and resumes)
    the same sweep on any later day, while a different grid gets its own folder."""
    identity = {"backend": config.backend, "alpha": list(config.alphas), "seeds": list(config.seeds),
                "mechanisms": list(config.mechanisms), "eta": list(config.eta), "extra": list(config.extra),
                "steps": config.steps, "train_module": config.train_module}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    return f"{prefix}-{digest}"


def concurrency(config: SweepConfig, runs: int) -> tuple[int, int | None]:
    """(runs at once, torch threads per run).

    local: ``jobs`` (default: the core count, at most the number of runs); ray: ``jobs`` (default: all runs).
    Threads per run default to 1 whenever more than one run can be live (several 1-thread runs side by side beat
    multi-thread runs on this model size, and never oversubscribe), and to :data:`SINGLE_RUN_THREADS` (measured by
    ``benchmarks/bench_local.py``) for a lone run. slurm: ``jobs`` (default: all runs) as the array parallelism and
    ``slurm.cpus_per_task`` threads (each job owns its CPUs); verl runs set no thread count. ``threads=N`` always
    wins.
    """
    if config.launcher == "slurm":
        jobs = config.jobs or max(1, runs)
        threads: int | None = config.threads or config.slurm.cpus_per_task
    else:
        jobs = config.jobs or max(1, min(available_cores(), runs) if config.launcher == "local" else runs)
        threads = config.threads or (1 if jobs > 1 else SINGLE_RUN_THREADS)
    if not backend_for(config).sets_threads:
        threads = None
    return jobs, threads


def plan_sweep(config: SweepConfig, name: str | None = None) -> SweepPlan:
    """Expand and validate the whole grid; raises :class:`ConfigError` naming the first bad value."""
    name = name or config.name or default_name(config)
    sweep_dir = Path(config.root) / name
    specs = expand_grid(config)
    jobs, threads = concurrency(config, len(specs))
    backend_for(config).check_machine(config)
    # The warm start runs alone, before the runs: a lone run's thread count.
    warm_threads = config.threads or (SINGLE_RUN_THREADS if config.launcher == "local" else threads)
    return SweepPlan(name=name, sweep_dir=sweep_dir, config=config, jobs=jobs, threads=threads,
                     warm_starts=plan_warm_starts(config, specs, sweep_dir, warm_threads),
                     runs=plan_runs(config, specs, name, sweep_dir, threads))


# --- run store helpers ---------------------------------------------------------------------------------------------
def read_status(run_dir: Path) -> dict[str, Any] | None:
    """A run's ``status.json`` through the run store's reader; None when absent or damaged."""
    from dataflex_rl.tracking import run_store

    try:
        return run_store.read_status(run_dir)
    except (OSError, ValueError):
        return None


def mark_run_store(run_dir: Path, state: str, error: str) -> None:
    """After the process is gone: turn a ``running`` status.json (the run could not write its own end, e.g. after
    SIGKILL) into ``state`` with ``error``, so the run store never claims a dead run is running."""
    status = read_status(run_dir)
    if status is None or status.get("state") != "running":
        return
    from dataflex_rl.tracking.run_store import RunStore

    RunStore(run_dir).set_status(state, step=status.get("step"), error=error)


def final_metric(run_dir: Path, key: str) -> float | None:
    """The last logged value of ``key`` (the run store's :func:`~dataflex_rl.tracking.run_store.final_value`), or
    None."""
    from dataflex_rl.tracking import run_store

    try:
        return run_store.final_value(run_dir, key)
    except (OSError, ValueError, KeyError):
        return None


def describe_exit(outcome: Outcome) -> str | None:
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
        if not self.quiet:
            print(text, flush=True)

    # entries
    def _entry(self, run: PlannedRun, warm_start: bool = False, **fields: Any) -> dict[str, Any]:
        base = {"log": str(run.log_path.relative_to(self.plan.sweep_dir.resolve())),
                "command": list(run.command), "env": dict(run.env)}
        if not warm_start:
            base.update(run.spec.describe(), backend=self.plan.config.backend,
                        run_dir=str(run.run_dir.relative_to(self.plan.sweep_dir.resolve())))
        return self.manifest.entry(run.name, {**base, **fields}, warm_start=warm_start)

    def pending_runs(self, runs: Sequence[PlannedRun]) -> list[PlannedRun]:
        """Runs to launch: all but the completed ones (run store says so; without a run store, as verl runs are,
        sweep.json does). Refuses runs still alive from an earlier invocation."""
        to_launch = []
        for run in runs:
            previous = self.manifest.previous(run.name) or {}
            status = read_status(run.run_dir)
            completed = (status.get("state") == "completed" if status is not None
                         else previous.get("state") == "completed" and previous.get("exit_code") == 0)
            if completed:
                self._entry(run, state="completed", exit_code=previous.get("exit_code", 0),
                            error=None)
                continue
            if previous.get("state") == "running":
                if self.launcher.still_running(previous.get("launch", {}), run):
                    raise ConfigError(f"run {run.name} is still running from an earlier invocation "
                                      f"({previous.get('launch')}); stop it or wait for it before resuming the sweep")
                mark_run_store(run.run_dir, "interrupted", "its sweep driver ended before the run did")
            self._entry(run, state="pending", exit_code=None, error=None)
            to_launch.append(run)
        self.manifest.save()
        return to_launch

    def _start(self, runs: Sequence[PlannedRun], warm_start: bool = False) -> list[Job]:
        for run in runs:
            entry = self._entry(run, warm_start=warm_start)
            attempt = int(entry.get("attempts", 0)) + 1
            write_log_header(run.log_path, attempt, run.shell_line())
        try:
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
                self.view.started(job.run.name, job.run.command, None if warm_start else job.run.run_dir,
                                  job.run.log_path, warm_start=warm_start)
        self.manifest.save()
        return jobs

    def _finish(self, job: Job, outcome: Outcome, warm_start: bool = False) -> str:
        if outcome.exit_code == 0 and outcome.error is None:
            state = "completed"
        elif self.stop_signal is not None or outcome.exit_code in INTERRUPTED_CODES:
            state = "interrupted"
        else:
            state = "failed"
        error = describe_exit(outcome)
        if not warm_start and state != "completed":
            mark_run_store(job.run.run_dir, state, error or state)
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
            if on_poll is not None and active and on_poll(active):
                self._stop(active, warm_start, states, reason="stopped by the driver")
                return states
            if self.view is not None:
                self.view.refresh()
            time.sleep(self.plan.config.poll_s)
        return states

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


# --- the sweep -----------------------------------------------------------------------------------------------------
def print_dry_run(plan: SweepPlan) -> None:
    print(f"sweep {plan.name}: {len(plan.runs)} run(s), {plan.jobs} at once, folder {plan.sweep_dir} (dry run: "
          f"nothing is started)")
    for run in plan.warm_starts:
        print(f"# warm start {run.name}\n{run.shell_line()}")
    for run in plan.runs:
        print(f"# {run.name}\n{run.shell_line()}")


def run_store_alpha(run_dir: Path) -> float | None:
    """The alpha a run recorded in its ``meta.json`` (None before it started)."""
    from dataflex_rl.tracking import run_store

    try:
        return float(run_store.read_meta(run_dir)["alpha"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def print_summary(plan: SweepPlan, manifest: Manifest, console: Any = None) -> None:
    """Two rich tables: each run's state and wall time, then the report's own per-group summary
    (:func:`analysis.report.summary_table`: accuracy after SFT, final-window mean and interval, paired delta), so the
    terminal and ``report.md`` show the same numbers."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    extra_columns = []
    if plan.config.mechanisms:
        extra_columns.append(("mechanism", lambda spec: spec.mechanism or ""))
    if plan.config.eta:
        extra_columns.append(("eta", lambda spec: "" if spec.eta is None else f"{spec.eta:g}"))
    axis_keys = list(grid_description(plan.config)["axes"])
    for key in axis_keys:
        extra_columns.append((key, lambda spec, key=key: spec.axes.get(key, "")))
    table = Table(title=f"sweep {plan.name}", title_justify="left")
    table.add_column("run")
    table.add_column("alpha", justify="right")
    table.add_column("seed", justify="right")
    for title, _ in extra_columns:
        table.add_column(title)
    table.add_column("state")
    table.add_column("wall time", justify="right")
    colours = {"completed": "green", "failed": "red", "interrupted": "yellow"}
    for run in plan.runs:
        entry = manifest.previous(run.name) or {}
        spec: RunSpec = run.spec
        state = entry.get("state", "pending")
        wall = entry.get("wall_time_s")
        alpha = spec.alpha if spec.alpha is not None else run_store_alpha(run.run_dir)  # a preset's own alpha
        table.add_row(run.name, "" if alpha is None else f"{alpha:g}", str(spec.seed),
                      *[getter(spec) for _, getter in extra_columns],
                      f"[{colours.get(state, 'white')}]{state}[/]",
                      "-" if not wall else f"{wall:.1f} s")
    console.print(table)
    console.print(f"{plan.jobs} run(s) at once, {thread_note(plan)}", highlight=False)
    print_group_summary(plan.sweep_dir, console)


def thread_note(plan: SweepPlan) -> str:
    """How many threads each run used and where that number came from."""
    if plan.threads is None:
        return "threads per run left to the backend"
    origin = "threads=" if plan.config.threads else (
        "slurm.cpus_per_task" if plan.config.launcher == "slurm" else "default")
    return f"{plan.threads} thread(s) per run ({origin})"


def print_group_summary(sweep_dir: Path, console: Any) -> None:
    """The report's per-group summary table of the sweep's completed runs (nothing when there is none yet)."""
    try:
        from analysis.load import load_sweep
        from analysis.report import summary_table
        from analysis.tables import to_rich

        summary = summary_table(load_sweep(sweep_dir, histograms=False))
    except Exception as error:  # noqa: BLE001  (a summary problem must not hide the runs' states)
        console.print(f"summary table skipped: {type(error).__name__}: {error}", highlight=False)
        return
    if summary is not None:
        rendered = to_rich(summary)
        if not console.is_terminal:  # a log file has no width to respect: never crop a value
            wide = console.options.update_width(1000)
            console.width = max(console.width, console.measure(rendered, options=wide).maximum)
        console.print(rendered)


def write_report(sweep_dir: Path) -> tuple[int, str]:
    """``analysis.report`` on the sweep folder; (exit status, message). Skipped when the package is missing."""
    try:
        from analysis.report import main as report_main
    except ImportError as error:
        return 0, f"report skipped: the analysis package is not importable ({error})"
    try:
        status = report_main([str(sweep_dir)])
    except Exception as error:  # noqa: BLE001  (a report problem must not hide the runs' results)
        return EXIT_FAILED, f"report failed: {type(error).__name__}: {error}"
    if status:
        return status, f"report failed (exit status {status})"
    return 0, f"report: {sweep_dir / 'report' / 'report.md'}"


def write_exports(sweep_dir: Path) -> str:
    """``analysis.export`` on the sweep folder (the report writes them too); returns a line saying what happened."""
    try:
        from analysis.export import export_sweep

        paths = export_sweep(sweep_dir)
    except Exception as error:  # noqa: BLE001  (an export problem must not hide the runs' results)
        return f"sweep tables skipped: {type(error).__name__}: {error}"
    return f"sweep tables: {paths['metrics']} and {paths['runs']}"


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
        launcher = build_launcher(config, plan.sweep_dir, plan.name, plan.jobs)
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    from filelock import FileLock, Timeout

    plan.sweep_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(plan.sweep_dir / ".sweep.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"error: sweep {plan.name} is being run by another driver (lock {lock.lock_file})", file=sys.stderr)
        return EXIT_REFUSED
    try:
        return _run_locked(plan, launcher, argv)
    finally:
        lock.release()


def _run_planned(plan: SweepPlan, runner: SweepRunner, to_launch: list[PlannedRun]) -> int:
    """The warm start, then the runs; returns the exit status (0, EXIT_FAILED or 128 + signal)."""
    exit_code = 0
    try:
        if to_launch and plan.warm_starts:
            print("SFT warm start (once, shared by every run)", flush=True)
            states = runner.run_all(plan.warm_starts, warm_start=True)
            if any(state != "completed" for state in states.values()):
                failed = [name for name, state in states.items() if state != "completed"]
                print(f"error: the SFT warm start failed; see {plan.sweep_dir / 'logs' / (failed[0] + '.log')}",
                      file=sys.stderr)
                exit_code = EXIT_FAILED
                to_launch = []
        states = runner.run_all(to_launch)
        if any(state != "completed" for state in states.values()):
            exit_code = EXIT_FAILED
    except SweepStopped as stopped:
        exit_code = 128 + stopped.signum
    return exit_code


def _run_locked(plan: SweepPlan, launcher: Launcher, argv: Sequence[str]) -> int:
    config = plan.config
    try:
        manifest = Manifest(plan.sweep_dir, plan.header())
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    invocation = {"argv": list(argv), "start": utc_now(), "end": None, "exit_code": None}
    manifest.data["invocations"].append(invocation)
    exit_code = 0
    with SweepRunner(plan, launcher, manifest) as runner:
        try:
            to_launch = runner.pending_runs(plan.runs)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_REFUSED
        skipped = len(plan.runs) - len(to_launch)
        print(f"sweep {plan.name}: {len(plan.runs)} run(s) ({skipped} already completed), {plan.jobs} at once, "
              f"{thread_note(plan)}; folder {plan.sweep_dir}", flush=True)
        runner.view = SweepView(total=len(plan.runs), done_before=skipped, jobs=plan.jobs)
        with runner.view:
            exit_code = _run_planned(plan, runner, to_launch)
    manifest.data["state"] = ("interrupted" if exit_code > 128 else "failed" if exit_code else "completed")
    invocation.update(end=utc_now(), exit_code=exit_code)
    manifest.save()
    print_summary(plan, manifest)
    if config.report and exit_code <= 128 and any(
            (manifest.previous(run.name) or {}).get("state") == "completed" for run in plan.runs):
        status, message = write_report(plan.sweep_dir)
        print(message, flush=True)
        if status and not exit_code:
            exit_code = EXIT_FAILED
    elif exit_code <= 128:
        print(write_exports(plan.sweep_dir), flush=True)
    print(f"sweep folder: {plan.sweep_dir}  (sweep.json, logs/, one run store per run)", flush=True)
    return exit_code


def summary_rows(manifest_data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """(run, alpha, seed, state, exit_code) of every run in a sweep.json, for scripts and tests."""
    return [{key: entry.get(key) for key in ("run", "alpha", "seed", "state", "exit_code")}
            for entry in manifest_data.get("runs", [])]
