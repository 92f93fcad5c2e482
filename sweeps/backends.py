"""Backends as the sweep driver sees them: one object per ``backend=`` choice, the only place that knows it.

A :class:`Backend` builds a run's command and environment, validates the whole grid before anything starts, plans
the shared warm starts and says whether the driver sets a thread count; the driver and the Optuna search call
these methods and never branch on the backend's name. Adding a backend is a subclass registered in
:data:`BACKENDS` (its name is the ``backend=`` value) plus its command builder. The local backend plans its runs
itself (:meth:`LocalBackend.plan`): it composes and validates each run's config once, and the command reads that
config (:func:`sweeps.commands.local_runs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dataflex_rl.registry import Registry
from sweeps.commands import (
    LOG_FOLDER,
    PlannedRun,
    check_gpu_available,
    common_config,
    local_overrides,
    local_runs,
    local_warm_starts,
    planned_steps,
    thread_environment,
    validate_verl,
    verl_command,
    verl_environment,
    verl_prepare,
)
from sweeps.config import STEPS_KEYS, SweepConfig
from sweeps.grid import RunSpec
from sweeps.launchers import launcher_class

BACKENDS = Registry("backend")


class Backend:
    """How a sweep runs on one backend (see the module doc). Subclasses set ``name`` and implement :meth:`command`
    (or :meth:`plan`, when validating a run's config is what builds its command)."""

    name: str = ""
    # False: the backend manages its own threads, so the driver passes no thread count.
    sets_threads: bool = True

    def command(self, config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path,
                threads: int | None) -> tuple[str, ...]:
        """The argv of one run."""
        raise NotImplementedError

    def environment(self, config: SweepConfig, sweep: str, spec: RunSpec, threads: int | None) -> dict[str, str]:
        """The environment variables one run adds to the driver's."""
        return {}

    def validate(self, config: SweepConfig, planned: Sequence[PlannedRun]) -> None:
        """Refuse the sweep before anything starts when any run's config is bad (ConfigError naming run and key)."""

    def check_machine(self, config: SweepConfig) -> None:
        """Refuse a sweep this machine cannot run (before planning the runs)."""

    def jobs_here(self, config: SweepConfig) -> tuple[int, str] | None:
        """``(runs at once, why)`` when this backend's runs on this machine need fewer than the core count at once
        (``jobs`` unset, a launcher whose runs share this machine); None: the driver's rule."""
        return None

    def common_config(self, config: SweepConfig) -> dict | None:
        """The resolved settings every run shares, flattened, that a rerun of the sweep is compared on; None: the
        common overrides' text is compared instead."""
        return None

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        """Shared warm starts to run before the runs (none by default)."""
        return []

    def plan(self, config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
             threads: int | None) -> list[PlannedRun]:
        """Every run's command, environment, run folder and log, validated."""
        sweep_dir = sweep_dir.resolve()
        planned = [PlannedRun(spec=spec, command=self.command(config, spec, sweep, sweep_dir, threads),
                              env=self.environment(config, sweep, spec, threads), run_dir=sweep_dir / spec.name,
                              log_path=sweep_dir / LOG_FOLDER / f"{spec.name}.log",
                              total_steps=planned_steps(config, STEPS_KEYS[self.name])) for spec in specs]
        self.validate(config, planned)
        return planned


@BACKENDS.register("local")
class LocalBackend(Backend):
    """The CPU backend: ``python -m dataflex_rl.train``, each run's config composed and validated once in process
    and read by the trainer from a file; a cached SFT warm start."""

    name = "local"

    def plan(self, config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
             threads: int | None) -> list[PlannedRun]:
        """Every run's overrides (:func:`sweeps.commands.local_overrides`) composed with ``conf/train.yaml`` and
        parsed, once; the command reads the resolved config (``--config-file``), or carries the overrides when
        ``validate=false`` (:func:`sweeps.commands.local_runs`)."""
        sweep_dir = sweep_dir.resolve()
        entries = [(spec, local_overrides(config, spec, sweep, sweep_dir, threads), sweep_dir / spec.name)
                   for spec in specs]
        return local_runs(config, entries, sweep_dir, thread_environment(threads))[0]

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        """One SFT warm start per SFT-relevant axis combination, unless cached (:func:`local_warm_starts`)."""
        return local_warm_starts(config, specs, sweep_dir, threads)

    def common_config(self, config: SweepConfig) -> dict | None:
        """The resolved train config of the common settings (:func:`sweeps.commands.common_config`), unless
        ``validate=false`` (a stand-in trainer, whose config is not conf/train.yaml)."""
        return common_config(config) if config.validate else None


@BACKENDS.register("verl")
class VerlBackend(Backend):
    """The GPU backend: ``python -m verl.trainer.main_ppo`` command lines, validated by the verl command builder."""

    name = "verl"
    sets_threads = False

    def command(self, config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path,
                threads: int | None) -> tuple[str, ...]:
        """The verl argv, with the run store's place and axes (:func:`sweeps.commands.verl_command`)."""
        return verl_command(config, spec, sweep, sweep_dir)

    def environment(self, config: SweepConfig, sweep: str, spec: RunSpec, threads: int | None) -> dict[str, str]:
        """W&B's group and tags through the environment (verl starts W&B itself), and verl's CPU mode for an
        experiment with ``platform: cpu``."""
        return verl_environment(config, sweep, spec)

    def validate(self, config: SweepConfig, planned: Sequence[PlannedRun]) -> None:
        """Compose verl's config of every run and check it as the trainer will (unless ``validate=false``)."""
        if config.validate:
            validate_verl(config, planned)

    def check_machine(self, config: SweepConfig) -> None:
        """Runs launched on this machine need a CUDA GPU (verl's rollout does) unless the experiment runs in verl's
        CPU mode; dry runs and clusters do not."""
        if launcher_class(config.launcher).runs_here and not config.dry_run:
            check_gpu_available(config)

    def jobs_here(self, config: SweepConfig) -> tuple[int, str] | None:
        """One run at a time in verl's CPU mode: each run starts its own Ray cluster and uses every core, and Ray
        gives a starting node 30 s (``ray/_private/node.py``), which two runs starting together on a busy laptop
        overrun (``The current node timed out during startup``)."""
        from dataflex_rl.verl.command import load_experiment

        if load_experiment(config.verl_experiment).get("platform") == "cpu":
            return 1, "verl's CPU mode: each run starts its own Ray cluster on every core"
        return None

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        """The experiment's prepare step (model, tokenizer, data), when it has one (:func:`verl_prepare`)."""
        return verl_prepare(config, specs, sweep_dir, threads)


def backend_for(config: SweepConfig) -> Backend:
    """The backend object of ``config.backend``."""
    return BACKENDS.get(config.backend)()


def plan_runs(config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
              threads: int | None) -> list[PlannedRun]:
    """The command line of every run, validated (local: composed and parsed; verl: built by the verl builder)."""
    return backend_for(config).plan(config, specs, sweep, sweep_dir, threads)


def plan_warm_starts(config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                     threads: int | None) -> list[PlannedRun]:
    """The backend's shared warm starts (local: :func:`sweeps.commands.local_warm_starts`; verl: the experiment's
    prepare step, if any)."""
    return backend_for(config).warm_starts(config, specs, sweep_dir, threads)
