"""A sweep's plan: the grid expanded into runs (:mod:`sweeps.grid`), how many run at once with how many threads, and
each run's validated command (the backend's), fixed before the first process starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from sweeps.backends import get_backend
from sweeps.run_plan import SweepPlan
from sweeps.config import SINGLE_RUN_THREADS, SweepConfig, available_cores
from sweeps.grid import RunSpec
from sweeps.launchers import launcher_class


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """``threads`` None: left to the backend; ``note``: the line saying where each number comes from."""

    jobs: int
    threads: int | None
    warm_start_threads: int | None
    note: str


def concurrency(config: SweepConfig, runs: int) -> Concurrency:
    launcher = launcher_class(config.launcher)
    from_launcher = launcher.threads_per_run(config.launcher_settings)
    backend = get_backend(config.backend)
    here = backend.jobs_here(config) if launcher.runs_here and not config.jobs else None
    jobs = config.jobs or max(1, min(here[0] if here else available_cores(), runs) if launcher.runs_here else runs)
    note = f"{jobs} run(s) at once" + (f" ({here[1]}; jobs=N to change)" if here else "")
    if not backend.sets_threads:
        return Concurrency(jobs, None, config.threads or (SINGLE_RUN_THREADS if launcher.runs_here else None),
                           note + ", threads per run left to the backend")
    threads = config.threads or from_launcher or (1 if jobs > 1 else SINGLE_RUN_THREADS)
    origin = "threads=" if config.threads else launcher.threads_origin if from_launcher else "default"
    return Concurrency(jobs, threads, config.threads or (SINGLE_RUN_THREADS if launcher.runs_here else threads),
                       note + f", {threads} thread(s) per run ({origin})")


def plan_sweep(config: SweepConfig, name: str, specs: Sequence[RunSpec]) -> tuple[SweepPlan, str]:
    shared = concurrency(config, len(specs))
    sweep_dir = Path(config.root) / name
    backend = get_backend(config.backend)
    backend.check_machine(config)
    runs = backend.plan(config, specs, name, sweep_dir, shared.threads)  # validates every run's config first
    return SweepPlan(name=name, sweep_dir=sweep_dir, config=config, jobs=shared.jobs, threads=shared.threads,
                     warm_starts=backend.warm_starts(config, specs, sweep_dir, shared.warm_start_threads),
                     runs=runs, common_config=backend.common_config(config)), shared.note
