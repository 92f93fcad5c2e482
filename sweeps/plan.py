"""A sweep's plan, fixed before the first process starts: the grid's runs (:mod:`sweeps.grid`), how many run at once
with how many threads, each run ready to launch (:class:`PlannedRun`, its command validated by the backend), the
whole plan (:class:`SweepPlan`), and what every backend's planning shares (log folder, thread caps, RL steps)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.run_config import write_config_file
from dataflex_rl.validation import ConfigError
from sweeps.backends import get_backend
from sweeps.sweep_config import (SINGLE_RUN_THREADS, SweepConfig, available_cores, common_overrides, common_sets,
                                 extra_axes, grid_alphas, grid_presets, run_steps)
from sweeps.grid import RunSpec
from sweeps.launchers import launcher_class

LOG_FOLDER = "logs"


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """A run ready to launch; ``config_file``: what the command reads, written as it starts."""

    spec: RunSpec
    command: tuple[str, ...]
    env: dict[str, str]
    run_dir: Path
    log_path: Path
    overrides: tuple[str, ...] = ()
    config: dict[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    config_file: Path | None = None
    total_steps: int | None = None  # the run's RL steps, when the plan knows them (the live view's bar)
    serves: tuple[str, ...] = ()  # a warm start: the runs that start from it (it runs only when one of them does)

    @property
    def name(self) -> str:
        return self.spec.name

    def shell_line(self) -> str:
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        line = " ".join([*assignments, shlex.join(self.command)])
        if self.config_file is not None:
            line += f"  # composed from: {shlex.join(self.overrides)}"
        return line

    def write_config_file(self) -> None:
        if self.config_file is None or self.config is None:
            return
        write_config_file(self.config_file, self.config, comment=[
            f"{self.name}: conf/train.yaml composed with these overrides and validated by the sweep driver:",
            f"  {shlex.join(self.overrides)}",
            "(python -m dataflex_rl.local.train <these overrides> composes the same config; the run reads this file)",
        ])


@dataclasses.dataclass
class SweepPlan:
    name: str
    sweep_dir: Path
    config: SweepConfig
    jobs: int
    threads: int | None
    warm_starts: list[PlannedRun]
    runs: list[PlannedRun]
    common_config: dict[str, Any] | None = None  # the backend's resolved common settings (Backend.common_config)

    def header(self) -> dict[str, Any]:
        config = self.config
        grid = {"alpha": list(grid_alphas(config)), "seed": list(config.seeds), "mechanism": list(grid_presets(config)),
                "eta": list(config.eta), "axes": {axis.key: list(axis.values) for axis in extra_axes(config)},
                "common_overrides": [str(item) for item in common_overrides(config)]}
        if self.common_config is not None:
            grid["common_config"] = self.common_config
        recorded = get_backend(config.backend).recorded_settings(config)
        return {"sweep": self.name, "backend": config.backend, "launcher": config.launcher,
                "warm_start": config.warm_start, "grid": grid, "steps": run_steps(config), "jobs": self.jobs,
                "threads": self.threads, "train_module": config.train_module,
                **({"backend_settings": recorded} if recorded is not None else {})}


def thread_environment(threads: int | None) -> dict[str, str]:
    """OpenMP/MKL thread caps, so parallel runs never oversubscribe the cores."""
    return {} if threads is None else {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def check_steps_once(config: SweepConfig, key: str) -> None:
    if config.steps is not None and common_sets(config, key):
        raise ConfigError(f"steps = {config.steps} is not allowed together with extra {key}=...: give one of them")


def planned_steps(config: SweepConfig, key: str) -> int | None:
    """``steps``, else a plain-integer common override of ``key``, else None."""
    if run_steps(config) is not None:
        return run_steps(config)
    value = next((item.value for item in reversed(common_overrides(config)) if item.key == key), None)
    return int(value) if value is not None and value.isdigit() else None


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
