"""The local backend as the sweep driver sees it (``conf/backend/local.yaml``; docs/sweeps.md)."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.compose import EXPERIMENT_GROUP, TrainComposer, check_group_choice, compose_train_config
from dataflex_rl.keys import check_metric_key
from dataflex_rl.overrides import Override, hydra_value
from dataflex_rl.run_config import CONFIG_FILE_FLAG
from dataflex_rl.validation import ConfigError, check_int_at_least, parse_switch
from dataflex_rl.run_config import quiet_verl_import
from sweeps.backends import Backend
from sweeps.sweep_config import SweepConfig, common_overrides, common_sets, run_steps
from sweeps.grid import STANDARD_FACTORS, RunSpec, warm_start_overrides
from sweeps.plan import LOG_FOLDER, PlannedRun, check_steps_once, planned_steps, thread_environment

# A run's cost on an idle machine, one thread (the eval rows of benchmarks/bench_local.py, the default experiment):
# what the study's wall-time estimate uses.
STEP_S, VALIDATION_ITEM_S, RUN_OVERHEAD_S = 0.66, 0.0008, 10.0
SFT_FOLDER = ".sft"  # run_dir given to ``mode=sft`` (hidden, so the analysis never takes it for a run)
LAUNCH_FOLDER = "launch"  # <sweep>/launch/<run>.yaml: the resolved config a run's command reads
# The SFT warm start is cached by model + task + sft config: only axes over these need a warm start of their own.
SFT_CACHE_GROUPS = ("model", "task", "sft")
# Keys of a run's resolved config that place or name the run rather than set its numbers (the sweep sets them).
RUN_PLACE_KEYS = ("run_dir", "sweep", "run_name", "seed", "axes", "mode", "threads", "mechanism_label", "warm_start")


@dataclasses.dataclass(frozen=True)
class LocalSettings:
    """The sweep's ``local:`` block (``local.steps=200``)."""

    # RL steps per run when neither ``steps`` nor ``extra`` sets them nor an experiment is named (the trainer's own
    # 400 are long for a laptop); None: the trainer's own.
    steps: int | None = 120
    sft_warm_start: bool = True  # build the cached SFT warm starts before the runs

    def __post_init__(self) -> None:
        if self.steps is not None:
            check_int_at_least("steps", self.steps, 1)
        object.__setattr__(self, "sft_warm_start", parse_switch("sft_warm_start", self.sft_warm_start))


class LocalBackend(Backend):
    settings = LocalSettings
    steps_key = "trainer.total_steps"

    def check_extra(self, override: Override) -> None:
        check_group_choice(override)  # a config-group choice names a file of its conf/ group

    def check_metric(self, key: str, value: Any) -> str:
        return check_metric_key(key, value)

    def default_steps(self, config: SweepConfig) -> int | None:
        """``local.steps``, unless ``extra`` sets the steps or names an experiment, whose own ``trainer.total_steps``
        then hold."""
        if common_sets(config, self.steps_key) or common_sets(config, EXPERIMENT_GROUP):
            return None
        return config.backend_settings.steps

    def plan(self, config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
             threads: int | None) -> list[PlannedRun]:
        sweep_dir = sweep_dir.resolve()
        entries = [(spec, self.overrides(config, spec, sweep, sweep_dir, threads), sweep_dir / spec.name)
                   for spec in specs]
        return self.runs(config, entries, sweep_dir, local_environment(threads))[0]

    def overrides(self, config: SweepConfig, spec: RunSpec, sweep: str, sweep_dir: Path,
                  threads: int | None) -> list[str]:
        check_steps_once(config, self.steps_key)
        overrides = [*steps_override(config), *map(str, common_overrides(config)), *spec.overrides]
        if spec.axis_keys:  # the run records these keys' values as its identity (meta.json axes)
            overrides.append(f"axes=[{','.join(spec.axis_keys)}]")
        overrides += [f"run_dir={hydra_value(sweep_dir / spec.name)}", f"sweep={sweep}", f"run_name={spec.name}",
                      f"warm_start={config.warm_start}"]
        if threads is not None:
            overrides.append(f"threads={threads}")
        return overrides

    def runs(self, config: SweepConfig, entries: Sequence[tuple[RunSpec, Sequence[str], Path]], sweep_dir: Path,
             env: dict[str, str]) -> tuple[list[PlannedRun], list[Any]]:
        if config.validate:
            from dataflex_rl.run_config import parse_train_config

            composed = []
            with quiet_verl_import(), TrainComposer() as compose:
                for spec, overrides, _ in entries:
                    try:
                        resolved = compose(overrides)
                        composed.append((resolved, parse_train_config(resolved)))
                    except ConfigError as error:
                        raise ConfigError(f"run {spec.name}: {error}") from None
        else:
            composed = [(None, None)] * len(entries)
        planned = []
        for (spec, overrides, run_dir), (resolved, train_config) in zip(entries, composed, strict=True):
            config_file = None if resolved is None else sweep_dir / LAUNCH_FOLDER / f"{spec.name}.yaml"
            arguments = list(overrides) if config_file is None else [CONFIG_FILE_FLAG, str(config_file)]
            steps = planned_steps(config, self.steps_key) if train_config is None \
                else train_config.trainer.total_steps
            planned.append(PlannedRun(spec=spec, command=(sys.executable, "-m", config.train_module, *arguments),
                                      env=dict(env), run_dir=run_dir,
                                      log_path=sweep_dir / LOG_FOLDER / f"{spec.name}.log",
                                      overrides=tuple(overrides), config=resolved, config_file=config_file,
                                      total_steps=steps))
        return planned, [train_config for _, train_config in composed]

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        if not config.backend_settings.sft_warm_start:
            return []
        sweep_dir = sweep_dir.resolve()
        served: dict[tuple[tuple[str, ...], int | None], list[str]] = {}  # each warm start -> the runs starting from it
        for spec in specs:
            served.setdefault((tuple(str(override) for axis, override in spec.settings() if axis.name not in
                                     STANDARD_FACTORS and override.group in SFT_CACHE_GROUPS), spec.warm_start_seed),
                              []).append(spec.name)
        variants = list(served)
        axis_variants = list(dict.fromkeys(axis_overrides for axis_overrides, _ in variants))
        entries = []
        for axis_overrides, seed in variants:
            name = "-".join(["sft", *([str(axis_variants.index(axis_overrides))] if len(axis_variants) > 1 else []),
                             *([f"seed{seed}"] if seed is not None else [])])
            overrides = [*map(str, common_overrides(config)), *axis_overrides, *warm_start_overrides(seed), "mode=sft",
                         f"run_dir={hydra_value(sweep_dir / SFT_FOLDER)}"]
            if threads is not None:
                overrides.append(f"threads={threads}")
            entries.append((RunSpec(name=name), overrides, sweep_dir / SFT_FOLDER))
        planned, train_configs = self.runs(config, entries, sweep_dir, local_environment(threads))
        planned = [dataclasses.replace(run, serves=tuple(served[variant]))
                   for run, variant in zip(planned, variants, strict=True)]
        if config.validate:
            from dataflex_rl.tinylm.sft import cached_entry

            planned = [run for run, train_config in zip(planned, train_configs, strict=True)
                       if train_config.sft.steps and not cached_entry(Path(warm_start_key(train_config)))]
        return planned

    def common_config(self, config: SweepConfig) -> dict | None:
        return common_train_config(config) if config.validate else None

    def estimate_seconds(self, config: SweepConfig, runs: int, jobs: int) -> tuple[float, str, str]:
        from dataflex_rl.run_config import parse_train_config

        with quiet_verl_import():
            trainer = parse_train_config(compose_train_config(
                [*steps_override(config), *map(str, common_overrides(config)), "run_dir=."])).trainer
        values = common_train_config(config)
        validation = trainer.evaluations * min(trainer.val_size, int(values["task.test_size"])) * VALIDATION_ITEM_S
        seconds = math.ceil(runs / max(1, jobs)) * (trainer.total_steps * STEP_S + validation + RUN_OVERHEAD_S)
        return seconds, f"{trainer.total_steps} steps", (f"{STEP_S:g} s per RL step and {VALIDATION_ITEM_S * 1e3:g} ms "
                                                         f"per validation item, one thread each, measured by "
                                                         f"the eval rows of benchmarks/bench_local.py")

    def starting_lr(self) -> float:
        from dataflex_rl.run_config import TrainerConfig

        return TrainerConfig.lr


def common_train_config(config: SweepConfig) -> dict[str, Any]:
    """The resolved common settings (no cell's own), minus keys that cannot change a run's numbers."""
    from dataflex_rl.tracking.run_store import FINGERPRINT_IGNORED, flatten_config

    overrides = [*steps_override(config), *map(str, common_overrides(config)), "run_dir=."]
    with quiet_verl_import():
        resolved = compose_train_config(overrides)
    dropped = (*FINGERPRINT_IGNORED, *RUN_PLACE_KEYS, "hydra")
    return {key: value for key, value in flatten_config(resolved).items()
            if not any(key == prefix or key.startswith(prefix + ".") for prefix in dropped)}


def steps_override(config: SweepConfig) -> list[str]:
    """``trainer.total_steps=<steps>`` when the sweep sets a run's steps (:func:`sweeps.sweep_config.run_steps`)."""
    steps = run_steps(config)
    return [] if steps is None else [f"{LocalBackend.steps_key}={steps}"]


def local_environment(threads: int | None) -> dict[str, str]:
    """A local run's or warm start's environment: the thread caps, and verl's plugins left unloaded (the local
    trainer uses verl's own math only; this project's plugin, the trainer modes and the dataflex loss route of
    ``backend=verl``, costs about a second of imports per process)."""
    return {**thread_environment(threads), "VERL_USE_EXTERNAL_PLUGINS": "none"}


def warm_start_key(train_config: Any) -> str:
    """The run's SFT warm start's cache folder."""
    from dataflex_rl.tinylm.sft import sft_cache_key

    sft = train_config.sft
    return str(Path(sft.cache_dir) / sft_cache_key(train_config.model, train_config.task, sft))
