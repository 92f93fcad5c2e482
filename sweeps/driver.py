"""Run a planned sweep: warm start once, then every run in its own process, at most ``jobs`` at once.

:func:`run_sweep` is what ``python -m sweeps`` does: expand and validate the grid (a bad value refuses the whole
sweep before anything starts), print the command lines (``dry_run``) or run them in a :class:`~sweeps.session.
SweepSession` (lock, sweep.json, invocation record, warm start, exit code; shared with the Optuna search), then
print the summary table and write the report. The scheduling loop is :class:`sweeps.runner.SweepRunner`; resume and
stop signals are described there.

Imports point one way: the driver imports ``planning`` (a seed plan runs the driver's invocation through a
callback, so planning needs nothing of the driver), ``session``, ``runner`` and ``summary``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from dataflex_rl.validation import ConfigError
from sweeps.backends import backend_for, plan_runs, plan_warm_starts
from sweeps.commands import PlannedRun
from sweeps.config import SINGLE_RUN_THREADS, SweepConfig, available_cores
from sweeps.grid import default_name, expand_grid
from sweeps.launchers import launcher_class
from sweeps.progress import SweepView
from sweeps.runner import EXIT_FAILED, EXIT_REFUSED, SweepPlan
from sweeps.session import SessionRefused, SweepSession
from sweeps.summary import print_dry_run, print_summary, thread_note, write_exports, write_report


def concurrency(config: SweepConfig, runs: int) -> tuple[int, int | None]:
    """(runs at once, torch threads per run).

    A launcher whose runs share this machine (``process``): ``jobs`` defaults to the core count, at most the number
    of runs; any other (slurm, ray): to every run. Threads per run come from the launcher's settings when it has
    them (slurm: ``slurm.cpus_per_task``, each job owns its CPUs), else default to 1 whenever more than one run can
    be live (several 1-thread runs side by side beat multi-thread runs on this model size, and never oversubscribe)
    and to :data:`SINGLE_RUN_THREADS` (measured by ``benchmarks/bench_local.py``) for a lone run; verl runs set no
    thread count. ``threads=N`` always wins.
    """
    launcher = launcher_class(config.launcher)
    jobs = config.jobs or max(1, min(available_cores(), runs) if launcher.runs_here else runs)
    threads: int | None = (config.threads or launcher.threads_per_run(config.launcher_settings)
                           or (1 if jobs > 1 else SINGLE_RUN_THREADS))
    if not backend_for(config).sets_threads:
        threads = None
    return jobs, threads


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
                  f"once, {thread_note(plan)}; folder {plan.sweep_dir}", flush=True)
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
        status, message = write_report(plan.sweep_dir)
        print(message, flush=True)
        if status and not exit_code:
            exit_code = EXIT_FAILED
    elif exit_code <= 128:
        print(write_exports(plan.sweep_dir), flush=True)
    print(f"sweep folder: {plan.sweep_dir}  (sweep.json, launch/, logs/, one run store per run)", flush=True)
    return exit_code
