"""The verl backend as the sweep driver sees it (``conf/backend/verl.yaml``; docs/verl.md)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dataflex_rl.dataflex_block import with_param_defaults
from dataflex_rl.hashing import stable_hash
from dataflex_rl.overrides import hydra_value
from dataflex_rl.validation import ConfigError
from dataflex_rl.verl.command import (
    build_verl_command,
    dataflex_arguments,
    experiment_environment,
    load_experiment,
    resolve_experiment,
    verl_overrides_of,
    wandb_environment,
)
from dataflex_rl.run_config import quiet_verl_import
from sweeps.backends import Backend
from sweeps.sweep_config import PRESET_DIR, SweepConfig, check_no_env_interpolation, common_overrides, run_steps
from sweeps.grid import PRESET_FACTOR, RunSpec
from sweeps.launchers import launcher_class
from sweeps.plan import LOG_FOLDER, PlannedRun, check_steps_once, planned_steps, thread_environment

PREPARED_FOLDER = "verl_prepared"  # what an experiment's prepare step writes (model, tokenizer, data)


@dataclasses.dataclass(frozen=True)
class VerlSettings:
    """The sweep's ``verl:`` block (``verl.experiment=verl_cpu_tiny``)."""

    experiment: str = "verl_kk_3b"  # conf/verl_experiment/<name>.yaml (or a path): the verl command's template

    def __post_init__(self) -> None:
        if not isinstance(self.experiment, str) or not self.experiment:
            raise ConfigError(f"experiment = {self.experiment!r} is not allowed: give a name of "
                              f"conf/verl_experiment/ or the path of an experiment file")
        resolve_experiment(self.experiment)  # a missing file is refused here, naming the experiments there are


class VerlBackend(Backend):
    settings = VerlSettings
    steps_key = "trainer.total_training_steps"
    sets_threads = False
    run_store_optional = True  # verl may have written only its checkpoints into a run's folder

    def check(self, config: SweepConfig) -> None:
        if config.experiment is not None:
            raise ConfigError(f"experiment = {config.experiment!r} is not allowed with backend={config.backend}: a "
                              f"named experiment is a local-backend setting; verl runs take verl.experiment=")

    def plan(self, config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
             threads: int | None) -> list[PlannedRun]:
        sweep_dir = sweep_dir.resolve()
        planned = [PlannedRun(spec=spec, command=self.command(config, spec, sweep, sweep_dir),
                              env=self.environment(config, sweep, spec), run_dir=sweep_dir / spec.name,
                              log_path=sweep_dir / LOG_FOLDER / f"{spec.name}.log",
                              total_steps=planned_steps(config, self.steps_key)) for spec in specs]
        if config.validate:
            from dataflex_rl.verl.config import validate_overrides

            with quiet_verl_import():
                for run in planned:
                    try:
                        validate_overrides(verl_overrides_of(run.command), run.env)
                    except ConfigError as error:
                        raise ConfigError(f"run {run.name}: {error}") from None
        return planned

    def recorded_settings(self, config: SweepConfig) -> dict:
        """The experiment file by name and content: a rerun from another file, or the same file edited, is refused."""
        path = resolve_experiment(config.backend_settings.experiment)
        return {"experiment": config.backend_settings.experiment,
                "experiment_hash": stable_hash(path.read_text(encoding="utf-8"))}

    def command(self, config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path) -> tuple[str, ...]:
        experiment = resolve_experiment(config.backend_settings.experiment)
        check_no_env_interpolation(f"verl.experiment = {str(experiment)!r}", experiment.read_text(encoding="utf-8"))
        check_steps_once(config, self.steps_key)
        dataflex = preset_overrides(spec.mechanism) if spec.mechanism else []
        axis_overrides = []
        for axis, override in spec.settings():
            if axis.name in ("alpha", "eta"):  # verl's dataflex block has every key: set, never added
                dataflex.append(f"{override.key}={override.value}")
            elif axis.name not in (PRESET_FACTOR, "seed"):
                axis_overrides.append(str(override))
        extra = [f"seed={spec.seed}"]
        if run_steps(config) is not None:
            extra.append(f"{self.steps_key}={run_steps(config)}")
        extra += [*map(str, common_overrides(config)), *axis_overrides, f"trainer.experiment_name={spec.name}",
                  f"trainer.default_local_dir={hydra_value(sweep_dir / spec.name / 'checkpoints')}",
                  f"+dataflex_run.dir={hydra_value(sweep_dir / spec.name)}",
                  f"+dataflex_run.sweep={hydra_value(sweep)}", f"+dataflex_run.name={hydra_value(spec.name)}",
                  f"+dataflex_run.seed={spec.seed}"]
        if spec.mechanism:
            extra.append(f"+dataflex_run.mechanism_label={spec.mechanism}")
        if spec.axis_keys:
            extra.append(f"+dataflex_run.axes=[{','.join(spec.axis_keys)}]")
        extra.append(f"+dataflex_run.warm_start={config.warm_start}")
        if prepare_block(config) is not None:
            extra.append(f"prepared={hydra_value(prepared_folder(sweep_dir, spec))}")
        try:
            return tuple(build_verl_command(config.backend_settings.experiment, dataflex, extra))
        except ConfigError as error:
            raise ConfigError(f"run {spec.name}: {error}") from None

    def environment(self, config: SweepConfig, sweep: str, spec: RunSpec) -> dict[str, str]:
        from dataflex_rl.tracking.identity import job_type_of

        environment = experiment_environment(config.backend_settings.experiment)
        environment.update(wandb_environment(sweep, [spec.mechanism] if spec.mechanism else []))
        job_type = job_type_of({name: value for name, value in spec.factors.items() if name != "seed"})
        if job_type:
            environment["WANDB_JOB_TYPE"] = job_type
        return environment

    def check_machine(self, config: SweepConfig) -> None:
        if not launcher_class(config.launcher).runs_here or config.dry_run or cpu_mode(config):
            return
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"backend = {config.backend!r} is not allowed with launcher={config.launcher} on this "
                              f"machine: it has no CUDA GPU (torch.cuda.is_available() is False). Use "
                              f"launcher=slurm or launcher=ray to send the runs to a GPU cluster, "
                              f"verl.experiment=verl_cpu_tiny for verl's CPU mode, dry_run=true to print the command "
                              f"lines, or backend=local")

    def jobs_here(self, config: SweepConfig) -> tuple[int, str] | None:
        """One run at a time in CPU mode: two Ray clusters starting together overrun Ray's node start."""
        return (1, "verl's CPU mode: each run starts its own Ray cluster on every core") if cpu_mode(config) else None

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        block = prepare_block(config)
        if block is None:
            return []
        sweep_dir = sweep_dir.resolve()
        prepare = OmegaConf.to_container(block, resolve=True)
        variants = {prepared_folder(sweep_dir, spec): spec.warm_start_overrides for spec in specs}
        planned = []
        for folder, warm_start_overrides in variants.items():
            command = (sys.executable, "-m", "dataflex_rl.verl.cpu.prepare", "--out", str(folder),
                       "--train-size", str(prepare["train_size"]), "--test-size", str(prepare["test_size"]),
                       *[str(item) for item in prepare.get("overrides") or []], *warm_start_overrides)
            name = "verl-prepare" if len(variants) == 1 else f"verl-prepare-{folder.name}"
            planned.append(PlannedRun(spec=RunSpec(name=name), command=command, env=thread_environment(threads),
                                      run_dir=folder, log_path=sweep_dir / LOG_FOLDER / f"{name}.log"))
        return planned


def cpu_mode(config: SweepConfig) -> bool:
    return load_experiment(config.backend_settings.experiment).get("platform") == "cpu"


def preset_overrides(name: str) -> list[str]:
    """``dataflex.<key>=<value>`` for every leaf of ``conf/dataflex/<name>.yaml`` (verl has no preset groups)."""
    block = OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"), resolve=True)
    return [argument.removeprefix("+") for argument in dataflex_arguments(with_param_defaults(block))]


def prepare_block(config: SweepConfig) -> Any:
    return load_experiment(config.backend_settings.experiment).get("prepare")


def prepared_folder(sweep_dir: Path, spec: RunSpec) -> Path:
    variant = "shared" if spec.warm_start_seed is None else f"sft-seed{spec.warm_start_seed}"
    return sweep_dir / PREPARED_FOLDER / variant
