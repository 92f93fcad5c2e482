"""Command lines of a sweep's runs, and their validation before anything starts.

Backend ``local``: a run's overrides are, in order, ``trainer.total_steps=<steps>``, the common ``extra`` overrides,
the cell's overrides (``dataflex=<preset> mechanism_label=<preset>``, ``++dataflex.actuator.params.alpha=<a>``,
``++dataflex.actuator.params.eta=<e>``, extra axes, ``seed=<s>``), then ``run_dir=<sweep folder>/<run> sweep=<sweep>
run_name=<run> threads=<n>``. Each run's config is composed here with ``conf/train.yaml`` and validated by
``parse_train_config``, once (the first bad one refuses the whole sweep); when the run starts, the resolved config
is written to ``<sweep folder>/launch/<run>.yaml`` (the SFT warm starts' too) and the command is
``python -m dataflex_rl.train --config-file <that file>``: the trainer composes nothing again. The overrides stay
on record: in that file's header, in the dry run's and the log header's command line (``# composed from: ...``) and
in ``sweep.json`` (``overrides``). With ``validate=false`` (a stand-in trainer whose config is not
``conf/train.yaml``) nothing is composed here and the command carries the overrides:
``python -m <train_module> <overrides>``.

Backend ``verl``: ``python -m verl.trainer.main_ppo trainer.v1.trainer_mode=dataflex_sync <experiment overrides>
+dataflex.* ...`` from :func:`dataflex_rl.verl.command.build_verl_command`, with ``seed=<s>``,
``trainer.total_training_steps=<steps>``, ``trainer.experiment_name=<run>`` (the W&B run name, the same as the
local backend's), ``trainer.default_local_dir=<sweep folder>/<run>/checkpoints`` and the run store's place
(``+dataflex_run.{dir,sweep,name,seed,mechanism_label}``, so the trainer writes ``<sweep folder>/<run>`` as the local
backend does); W&B's group comes from ``WANDB_RUN_GROUP``.
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dataflex_rl.local.cli import CONFIG_FILE_FLAG, write_config_file
from dataflex_rl.overrides import hydra_value, unknown_override_message
from dataflex_rl.validation import ConfigError
from dataflex_rl.verl.check import quiet_verl_import
from sweeps.config import CONF_DIR, PRESET_DIR, STEPS_KEYS, SweepConfig, check_no_env_interpolation
from sweeps.grid import PRESET_FACTOR, STANDARD_FACTORS, RunSpec, grid_description, warm_start_overrides

SFT_FOLDER = ".sft"  # run_dir given to ``mode=sft`` (hidden, so the analysis never takes it for a run)
LOG_FOLDER = "logs"
LAUNCH_FOLDER = "launch"  # <sweep>/launch/<run>.yaml: the resolved config a local run's command reads
PREPARED_FOLDER = "verl_prepared"  # what an experiment's prepare step writes (model, tokenizer, data)
# The SFT warm start is cached by model + task + sft config: only axes over these need a warm start of their own.
SFT_CACHE_GROUPS = ("model", "task", "sft")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """A run ready to launch: its cell, argv, the environment variables it adds, its run store and its log.

    A local run whose config the driver composed also has its ``overrides`` (what the run is, for people), its
    resolved ``config`` and the ``config_file`` its command reads, written by :meth:`write_config_file` as it
    starts."""

    spec: RunSpec
    command: tuple[str, ...]
    env: dict[str, str]
    run_dir: Path
    log_path: Path
    overrides: tuple[str, ...] = ()
    config: dict[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)
    config_file: Path | None = None
    total_steps: int | None = None  # the run's RL steps, when the plan knows them (the live view's bar)

    @property
    def name(self) -> str:
        """The run's name (its folder and W&B name)."""
        return self.spec.name

    def shell_line(self) -> str:
        """The command as one shell line, its environment variables first; for a command that reads a config file,
        the overrides it was composed from follow as a comment."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        line = " ".join([*assignments, shlex.join(self.command)])
        if self.config_file is not None:
            line += f"  # composed from: {shlex.join(self.overrides)}"
        return line

    def write_config_file(self) -> None:
        """Write the resolved config the command reads (atomically, headed by the overrides it was composed from);
        nothing for a command that carries its overrides."""
        if self.config_file is None or self.config is None:
            return
        write_config_file(self.config_file, self.config, comment=[
            f"{self.name}: conf/train.yaml composed with these overrides and validated by the sweep driver:",
            f"  {shlex.join(self.overrides)}",
            "(python -m dataflex_rl.train <these overrides> composes the same config; the run reads this file)",
        ])


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
    common_config: dict[str, Any] | None = None  # the backend's resolved common settings (Backend.common_config)

    def header(self) -> dict[str, Any]:
        """The sweep.json header: what fixes the sweep besides its runs."""
        grid = grid_description(self.config)
        if self.common_config is not None:
            grid["common_config"] = self.common_config
        return {"sweep": self.name, "backend": self.config.backend, "launcher": self.config.launcher,
                "warm_start": self.config.warm_start, "grid": grid, "steps": self.config.steps, "jobs": self.jobs,
                "threads": self.threads, "train_module": self.config.train_module}


def thread_environment(threads: int | None) -> dict[str, str]:
    """OpenMP/MKL thread caps, so the BLAS pools of parallel runs never oversubscribe the cores."""
    if threads is None:
        return {}
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _check_steps_once(config: SweepConfig, key: str) -> None:
    if config.steps is not None and config.common_sets(key):
        raise ConfigError(f"steps = {config.steps} is not allowed together with extra {key}=...: give one of them")


def planned_steps(config: SweepConfig, key: str) -> int | None:
    """A run's RL steps as the sweep sets them: ``steps``, else the common override of ``key`` when it is a plain
    integer, else None (the trainer's default)."""
    if config.steps is not None:
        return config.steps
    value = next((item.value for item in reversed(config.common) if item.key == key), None)
    return int(value) if value is not None and value.isdigit() else None


# --- local backend -----------------------------------------------------------------------------------------------
def local_overrides(config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path, threads: int | None) -> list[str]:
    """The overrides of one local run, in the order the module doc gives (the grid's axes as ``axes=[...]``)."""
    _check_steps_once(config, STEPS_KEYS["local"])
    overrides = [f"{STEPS_KEYS['local']}={config.steps}"] if config.steps is not None else []
    overrides += [*map(str, config.common), *spec.overrides]
    if spec.axis_keys:  # the run records these keys' values as its identity (meta.json axes)
        overrides.append(f"axes=[{','.join(spec.axis_keys)}]")
    overrides += [f"run_dir={hydra_value(sweep_dir / spec.name)}", f"sweep={sweep}", f"run_name={spec.name}",
                  f"warm_start={config.warm_start}"]
    if threads is not None:
        overrides.append(f"threads={threads}")
    return overrides


def sft_overrides(config: SweepConfig, axis_overrides: Sequence[str], sweep_dir: Path,
                  threads: int | None) -> list[str]:
    """``mode=sft`` with the common overrides and one set of extra-axis values (the SFT cache key's inputs)."""
    overrides = [*map(str, config.common), *axis_overrides, "mode=sft",
                 f"run_dir={hydra_value(sweep_dir / SFT_FOLDER)}"]
    if threads is not None:
        overrides.append(f"threads={threads}")
    return overrides


def train_command(config: SweepConfig, arguments: Sequence[str]) -> tuple[str, ...]:
    """``<python> -m <train_module> <arguments>`` (``train_module``: ``dataflex_rl.train`` unless a test swaps it)."""
    return (sys.executable, "-m", config.train_module, *arguments)


class TrainComposer:
    """``conf/train.yaml`` composed with many override lists, as Hydra's compose would, at the cost of one
    composition per distinct set of config-group choices (``dataflex=ar``, ``task=...``, ``experiment=kk``: the
    defaults list) rather than one per list: the runs of a sweep differ in values (seed, alpha, run_dir), so planning
    n runs is n copies of a few composed configs. Each list's value overrides are applied to a copy of its groups'
    config by Hydra's own step for them (``ConfigLoaderImpl._apply_overrides_to_config``, which Hydra runs after
    composing the defaults list), so the result equals ``compose(overrides)``. Use inside
    ``initialize_config_dir(CONF_DIR)``."""

    def __init__(self) -> None:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.parser = OverridesParser.create()
        self.repository = GlobalHydra.instance().config_loader().repository
        self.bases: dict[tuple[str, ...], Any] = {}
        self.parsed: dict[str, Any] = {}

    def _parse(self, text: str) -> Any:
        """Hydra's reading of one override, once per text (the common overrides recur in every run)."""
        if text not in self.parsed:
            self.parsed[text] = self.parser.parse_overrides([text])[0]
        return self.parsed[text]

    def _is_value(self, override: Any) -> bool:
        """Whether Hydra applies ``override`` to the composed config (a value), not to the defaults list (a group
        choice, a sweep or a ``hydra`` setting: these stay part of the composition)."""
        if override.is_sweep_override() or override.is_hydra_override():
            return False
        return isinstance(override.value(), dict) or not self.repository.group_exists(override.key_or_group)

    def __call__(self, overrides: Sequence[str]) -> Any:
        """The composed config (a ``DictConfig``, as ``compose`` returns it: no ``hydra`` block) of ``overrides``."""
        from hydra import compose
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        parsed = [self._parse(text) for text in overrides]
        values = [override for override in parsed if self._is_value(override)]
        groups = tuple(override.input_line for override in parsed if not self._is_value(override))
        base = self.bases.get(groups)
        if base is None:
            base = self.bases[groups] = compose(config_name="train", overrides=list(groups))
        config = copy.deepcopy(base)
        ConfigLoaderImpl._apply_overrides_to_config(values, config)
        return config


def compose_local(override_lists: Iterable[tuple[str, Sequence[str]]]) -> list[tuple[dict[str, Any], Any]]:
    """Compose ``conf/train.yaml`` with each (run name, overrides), resolve it and validate it; raise at the first
    bad one (a :class:`ConfigError` naming the run). One composition per distinct set of group choices
    (:class:`TrainComposer`), not one per run.

    Returns each run's ``(resolved config, TrainConfig)``, in order: the resolved config is what the run store
    records as ``config.yaml`` and what the run's command reads."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dataflex_rl.local.config import parse_train_config

    composed = []
    with quiet_verl_import(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composer = TrainComposer()
        for name, overrides in override_lists:
            try:
                resolved = OmegaConf.to_container(composer(overrides), resolve=True)
                composed.append((resolved, parse_train_config(resolved)))
            except ConfigError as error:
                raise ConfigError(f"run {name}: {error}") from None
            except (HydraException, OmegaConfBaseException) as error:
                unknown = unknown_override_message(
                    error, list(overrides), lambda others: compose(config_name="train", overrides=others))
                if unknown:
                    raise ConfigError(f"run {name}: {unknown}") from None
                raise ConfigError(f"run {name}: bad override in {' '.join(overrides)}: {error}") from None
    return composed


def local_runs(config: SweepConfig, entries: Sequence[tuple[RunSpec, Sequence[str], Path]], sweep_dir: Path,
               env: dict[str, str]) -> tuple[list[PlannedRun], list[Any]]:
    """Local runs (or warm starts) from ``(spec, overrides, run folder)`` entries, and each one's ``TrainConfig``.

    With ``validate`` (the default) each config is composed and validated here, once (:func:`compose_local`), and
    the command reads it: ``--config-file <sweep folder>/launch/<name>.yaml``. Without, nothing is composed (the
    TrainConfigs are None) and the command carries the overrides."""
    sweep_dir = sweep_dir.resolve()
    if config.validate:
        composed = compose_local((spec.name, overrides) for spec, overrides, _ in entries)
    else:
        composed = [(None, None)] * len(entries)
    planned = []
    for (spec, overrides, run_dir), (resolved, train_config) in zip(entries, composed, strict=True):
        config_file = None if resolved is None else sweep_dir / LAUNCH_FOLDER / f"{spec.name}.yaml"
        arguments = list(overrides) if config_file is None else [CONFIG_FILE_FLAG, str(config_file)]
        steps = planned_steps(config, STEPS_KEYS["local"]) if train_config is None \
            else train_config.trainer.total_steps
        planned.append(PlannedRun(spec=spec, command=train_command(config, arguments), env=dict(env),
                                  run_dir=run_dir, log_path=sweep_dir / LOG_FOLDER / f"{spec.name}.log",
                                  overrides=tuple(overrides), config=resolved, config_file=config_file,
                                  total_steps=steps))
    return planned, [train_config for _, train_config in composed]


# Keys of a run's resolved config that place or name the run rather than set its numbers (the sweep sets them).
RUN_PLACE_KEYS = ("run_dir", "sweep", "run_name", "seed", "axes", "mode", "threads", "mechanism_label", "warm_start")


def common_config(config: SweepConfig) -> dict[str, Any]:
    """The resolved ``conf/train.yaml`` the sweep's common settings give (``steps`` and the common ``extra``
    overrides, no cell's own), flattened to dotted keys, minus the keys that cannot change a run's numbers
    (:data:`~dataflex_rl.tracking.run_store.FINGERPRINT_IGNORED`) and :data:`RUN_PLACE_KEYS`: what a rerun of the
    sweep is compared on (``sweep.json`` ``grid.common_config``), as a run's resume compares its resolved config."""
    from hydra import compose, initialize_config_dir

    from dataflex_rl.tracking.run_store import FINGERPRINT_IGNORED, flatten_config

    overrides = [f"{STEPS_KEYS['local']}={config.steps}"] if config.steps is not None else []
    overrides += [*map(str, config.common), "run_dir=."]
    with quiet_verl_import(), initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        resolved = OmegaConf.to_container(compose(config_name="train", overrides=overrides), resolve=True)
    dropped = (*FINGERPRINT_IGNORED, *RUN_PLACE_KEYS, "hydra")
    return {key: value for key, value in flatten_config(resolved).items()
            if not any(key == prefix or key.startswith(prefix + ".") for prefix in dropped)}


def warm_start_cached(train_config: Any) -> bool:
    """Whether the SFT checkpoint this config needs is already in the cache (or it needs none: ``sft.steps=0``).

    The cache key is the trainer's own (:func:`dataflex_rl.local.sft.sft_cache_key`); ``sft.cache_dir`` is relative
    to the working directory, which the runs share with the driver.
    """
    sft = train_config.sft
    if sft.steps == 0:
        return True
    from dataflex_rl.local.sft import sft_cache_key

    return (Path(sft.cache_dir) / sft_cache_key(train_config.model, train_config.task, sft) / "done.json").exists()


# --- verl backend ------------------------------------------------------------------------------------------------
def preset_overrides(name: str) -> list[str]:
    """``dataflex.<key>=<value>`` for every leaf of ``conf/dataflex/<name>.yaml`` (verl has no preset groups)."""
    def leaves(node: object, prefix: str) -> Iterable[str]:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                yield from leaves(value, f"{prefix}.{key}")
        else:
            yield f"{prefix}={hydra_value(node)}"

    return list(leaves(OmegaConf.to_container(OmegaConf.load(PRESET_DIR / f"{name}.yaml"), resolve=True), "dataflex"))


def verl_command(config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path) -> tuple[str, ...]:
    """The verl argv of one run (validated by the command builder: bad dataflex values raise ConfigError)."""
    from dataflex_rl.verl.command import build_verl_command, resolve_experiment

    experiment = resolve_experiment(config.verl_experiment)
    check_no_env_interpolation(f"verl_experiment = {str(experiment)!r}", experiment.read_text(encoding="utf-8"))
    _check_steps_once(config, STEPS_KEYS["verl"])
    dataflex = preset_overrides(spec.mechanism) if spec.mechanism else []
    axis_overrides = []
    for axis, override in spec.settings():
        if axis.name in ("alpha", "eta"):  # verl's dataflex block has every key: set, never added
            dataflex.append(f"{override.key}={override.value}")
        elif axis.name not in (PRESET_FACTOR, "seed"):
            axis_overrides.append(str(override))
    extra = [f"seed={spec.seed}"]
    if config.steps is not None:
        extra.append(f"{STEPS_KEYS['verl']}={config.steps}")
    extra += [*map(str, config.common), *axis_overrides, f"trainer.experiment_name={spec.name}",
              f"trainer.default_local_dir={hydra_value(sweep_dir / spec.name / 'checkpoints')}",
              f"+dataflex_run.dir={hydra_value(sweep_dir / spec.name)}", f"+dataflex_run.sweep={hydra_value(sweep)}",
              f"+dataflex_run.name={hydra_value(spec.name)}", f"+dataflex_run.seed={spec.seed}"]
    if spec.mechanism:
        extra.append(f"+dataflex_run.mechanism_label={spec.mechanism}")
    if spec.axis_keys:
        extra.append(f"+dataflex_run.axes=[{','.join(spec.axis_keys)}]")
    extra.append(f"+dataflex_run.warm_start={config.warm_start}")
    if verl_prepare_block(config) is not None:
        extra.append(f"prepared={hydra_value(prepared_folder(sweep_dir, spec))}")
    try:
        return tuple(build_verl_command(config.verl_experiment, dataflex, extra))
    except ConfigError as error:
        raise ConfigError(f"run {spec.name}: {error}") from None


def verl_prepare_block(config: SweepConfig) -> Any:
    """The experiment's ``prepare`` block (what ``python -m dataflex_rl.verl.cpu.prepare`` writes before the
    runs: model, tokenizer, data), or None when its runs read a model and data the user gives."""
    from dataflex_rl.verl.command import load_experiment

    return load_experiment(config.verl_experiment).get("prepare")


def prepared_folder(sweep_dir: Path, spec: RunSpec) -> Path:
    """Where a verl run's model and data are prepared: ``<sweep>/verl_prepared/shared``, or with a warm start of its
    own (``warm_start=per_seed``) ``<sweep>/verl_prepared/sft-seed<s>``."""
    variant = "shared" if spec.warm_start_seed is None else f"sft-seed{spec.warm_start_seed}"
    return sweep_dir / PREPARED_FOLDER / variant


def verl_prepare(config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                 threads: int | None) -> list[PlannedRun]:
    """The experiment's prepare step as the sweep's warm starts, one per prepared folder the runs read
    (:func:`prepared_folder`: one, or one per seed under ``warm_start=per_seed``, each with its ``sft.seed``); a
    folder prepared from the same inputs is kept, from others refused. None without a ``prepare`` block."""
    block = verl_prepare_block(config)
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


def validate_verl(config: SweepConfig, planned: Sequence[PlannedRun]) -> None:
    """Refuse the sweep when any run's verl config would be refused by the trainer (composed and checked as the
    doctor does: :func:`dataflex_rl.verl.check.validate_overrides`), before anything starts."""
    from dataflex_rl.verl.check import validate_overrides
    from dataflex_rl.verl.command import verl_overrides_of

    with quiet_verl_import():
        for run in planned:
            try:
                validate_overrides(verl_overrides_of(run.command), run.env)
            except ConfigError as error:
                raise ConfigError(f"run {run.name}: {error}") from None


def verl_environment(config: SweepConfig, sweep: str, spec: RunSpec) -> dict[str, str]:
    """W&B's group (the sweep), tags (the preset) and job type (the non-seed factors, ``WANDB_JOB_TYPE``) for a
    verl run, which starts W&B itself, and the experiment's platform environment (verl's CPU mode)."""
    from dataflex_rl.tracking.identity import job_type_of
    from dataflex_rl.verl.command import experiment_environment, wandb_environment

    environment = experiment_environment(config.verl_experiment)
    environment.update(wandb_environment(sweep, [spec.mechanism] if spec.mechanism else []))
    job_type = job_type_of({name: value for name, value in spec.factors.items() if name != "seed"})
    if job_type:
        environment["WANDB_JOB_TYPE"] = job_type
    return environment


def check_gpu_available(config: SweepConfig) -> None:
    """Refuse the verl backend on a machine without a CUDA GPU (verl's rollout needs one), unless the experiment
    runs in verl's CPU mode (``platform: cpu``)."""
    import torch

    from dataflex_rl.verl.command import load_experiment

    if not torch.cuda.is_available() and load_experiment(config.verl_experiment).get("platform") != "cpu":
        raise ConfigError("backend = 'verl' is not allowed with launcher=process on this machine: it has no CUDA GPU "
                          "(torch.cuda.is_available() is False). Use launcher=slurm or launcher=ray to send the runs "
                          "to a GPU cluster, verl_experiment=verl_cpu_tiny for verl's CPU mode, dry_run=true to print "
                          "the command lines, or backend=local")


# --- local warm starts ---------------------------------------------------------------------------------------
def local_warm_starts(config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                      threads: int | None) -> list[PlannedRun]:
    """One ``mode=sft`` command per distinct warm start: per set of SFT-relevant axis values and, under
    ``warm_start=per_seed``, per seed (``sft-seed1``, ...; ``sft`` for the one shared warm start); none when off,
    and none for a checkpoint the cache already holds."""
    if not config.sft_warm_start:
        return []
    sweep_dir = sweep_dir.resolve()
    variants = list(dict.fromkeys((tuple(str(override) for axis, override in spec.settings()
                                         if axis.name not in STANDARD_FACTORS and override.group in SFT_CACHE_GROUPS),
                                   spec.warm_start_seed) for spec in specs))
    axis_variants = list(dict.fromkeys(axis_overrides for axis_overrides, _ in variants))
    entries = []
    for axis_overrides, seed in variants:
        name = "-".join(["sft", *([str(axis_variants.index(axis_overrides))] if len(axis_variants) > 1 else []),
                         *([f"seed{seed}"] if seed is not None else [])])
        entries.append((RunSpec(name=name), sft_overrides(config, [*axis_overrides, *warm_start_overrides(seed)],
                                                          sweep_dir, threads), sweep_dir / SFT_FOLDER))
    planned, train_configs = local_runs(config, entries, sweep_dir, thread_environment(threads))
    if config.validate:
        planned = [run for run, train_config in zip(planned, train_configs, strict=True)
                   if not warm_start_cached(train_config)]
    return planned
