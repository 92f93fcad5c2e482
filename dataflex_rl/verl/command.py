"""``python -m dataflex_rl.verl.command``: the verl command line of an experiment (docs/verl.md)."""

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.dataflex_block import parse_dataflex_config
from dataflex_rl.scorers import SCORERS
from dataflex_rl.overrides import hydra_value, parse_override
from dataflex_rl.validation import ConfigError, to_plain
from dataflex_rl.run_config import quiet_verl_import
from dataflex_rl.verl.config import (DEFAULT_TRAINER_MODE, ROUTE_OVERRIDES, ROUTE_TRAINERS, TRAINER_MODE_KEY,
                                     TRAINER_MODES, VERL_ENTRY_MODULE, check_trainer_mode, validate_overrides)
from dataflex_rl.verl.cpu import ENVIRONMENT as CPU_ENVIRONMENT, PLATFORM
from dataflex_rl.verl.run_record import BACKEND, RUN_BLOCK, WANDB_GROUP_VARIABLE, WANDB_TAGS_VARIABLE

# The experiment variable that picks the trainer, and the experiment's per-mode block of verl overrides.
TRAINER_MODE_VARIABLE = "trainer_mode"
MODE_OVERRIDES_BLOCK = "trainer_modes"
RECORD_MODULE = "dataflex_rl.verl.record"  # a policy-loss route run with a run store (dataflex_run.dir)
EXPERIMENT_DIR = Path(__file__).resolve().parents[2] / "conf" / "verl_experiment"


def resolve_experiment(experiment: str | Path) -> Path:
    path = Path(experiment)
    if path.is_file():
        return path
    named = EXPERIMENT_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if named.is_file():
        return named
    available = sorted(p.stem for p in EXPERIMENT_DIR.glob("verl_*.yaml")) if EXPERIMENT_DIR.is_dir() else []
    raise ConfigError(f"experiment = {str(experiment)!r} is not allowed: no such file, and no {named.name} in "
                      f"{EXPERIMENT_DIR}; verl experiments: {', '.join(available) or '(none)'}")


def load_experiment(experiment: str | Path) -> DictConfig:
    path = resolve_experiment(experiment)
    try:
        config = OmegaConf.load(path)
    except (yaml.YAMLError, UnicodeDecodeError, OmegaConfBaseException) as error:
        raise ConfigError(f"{path}: not a valid verl experiment file: {type(error).__name__}: {error}") from None
    if not isinstance(config, DictConfig) or config.get("backend") != BACKEND:
        found = config.get("backend") if isinstance(config, DictConfig) else None
        raise ConfigError(f"{path}: backend = {found!r} is not allowed: a verl experiment needs backend: {BACKEND}")
    overrides = OmegaConf.select(config, "verl.overrides", throw_on_missing=False)
    if not OmegaConf.is_list(overrides):
        raise ConfigError(f"{path}: verl.overrides must be a list of verl overrides 'key=value'")
    if "dataflex" not in config:
        raise ConfigError(f"{path}: dataflex: missing; a verl experiment needs a dataflex block")
    for mode, overrides in (config.get(MODE_OVERRIDES_BLOCK) or {}).items():
        check_trainer_mode(mode, f"{path}: {MODE_OVERRIDES_BLOCK}.{mode}")
        if not OmegaConf.is_list(overrides):
            raise ConfigError(f"{path}: {MODE_OVERRIDES_BLOCK}.{mode} must be a list of verl overrides 'key=value'")
    if config.get("platform") not in (None, PLATFORM):
        raise ConfigError(f"{path}: platform = {config.get('platform')!r} is not allowed: one of [None, '{PLATFORM}'] "
                          f"(null: verl picks the accelerator; cpu: verl's CPU mode, dataflex_rl.verl.cpu)")
    return config


def experiment_environment(experiment: str | Path | DictConfig) -> dict[str, str]:
    config = experiment if isinstance(experiment, DictConfig) else load_experiment(experiment)
    return dict(CPU_ENVIRONMENT) if config.get("platform") == PLATFORM else {}


def split_arguments(config: DictConfig, arguments: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    variable_names = [name for name in config.verl if name != "overrides"] + [TRAINER_MODE_VARIABLE]
    variables: dict[str, str] = {}
    dataflex_overrides, verl_overrides = [], []
    for argument in arguments:
        override = parse_override(argument)
        name = override.key.removeprefix("verl.")
        if override.group == "dataflex":
            dataflex_overrides.append(argument)
        elif override.value is not None and not override.prefix and name in variable_names:
            variables[name] = override.written_value  # the template quotes it
        else:
            verl_overrides.append(argument)
    return variables, dataflex_overrides, verl_overrides


def merge_dataflex(block: Any, overrides: Sequence[str]) -> dict[str, Any]:
    merged = OmegaConf.create(to_plain(block))
    for text in overrides:
        override = parse_override(text, where=f"dataflex override {text!r}")
        if override.value is None or not override.key.startswith("dataflex."):
            raise ConfigError(f"dataflex override {text!r} is not allowed: write dataflex.KEY=value, "
                              f"e.g. dataflex.actuator.params.alpha=0.5")
        parsed = OmegaConf.from_dotlist([f"{override.key.removeprefix('dataflex.')}={override.value}"])
        for component, registry in (("scorer", SCORERS), ("actuator", ACTUATORS)):
            new_name = OmegaConf.select(parsed, f"{component}.name", default=None)
            if new_name is None or new_name not in registry:
                continue  # no change of component, or an unknown one that validation below names
            known = {field.name for field in dataclasses.fields(registry.get(new_name).Params)}
            params = OmegaConf.select(merged, f"{component}.params", default=None) or {}
            merged[component] = {"name": new_name, "params": {key: params[key] for key in params if key in known}}
        merged = OmegaConf.merge(merged, parsed)
    return parse_dataflex_config(merged).to_dict()


def dataflex_arguments(block: Mapping[str, Any], prefix: str = "dataflex") -> list[str]:
    arguments = []
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            arguments.extend(dataflex_arguments(value, f"{prefix}.{key}"))
        else:
            arguments.append(f"+{prefix}.{key}={hydra_value(value)}")
    return arguments


def build_verl_command(experiment: str | Path, dataflex_overrides: Sequence[str] = (),
                       extra: Sequence[str] = ()) -> list[str]:
    config = load_experiment(experiment)
    variables, extra_dataflex, verl_extra = split_arguments(config, extra)
    config.verl.update(variables)
    for name in config.verl:
        if OmegaConf.is_missing(config.verl, name):
            raise ConfigError(f"verl.{name}: missing; pass {name}=VALUE on the command line (e.g. {name}=/path)")
    experiment_overrides = _resolved(config, "verl.overrides")
    mode = check_trainer_mode(config.verl.get(TRAINER_MODE_VARIABLE, DEFAULT_TRAINER_MODE),
                              f"verl.{TRAINER_MODE_VARIABLE}")
    if OmegaConf.select(config, f"{MODE_OVERRIDES_BLOCK}.{mode}", default=None) is not None:
        experiment_overrides += _resolved(config, f"{MODE_OVERRIDES_BLOCK}.{mode}")
    block = merge_dataflex(config.dataflex, [*dataflex_overrides, *extra_dataflex])
    if mode in TRAINER_MODES:
        return [sys.executable, "-m", VERL_ENTRY_MODULE, f"{TRAINER_MODE_KEY}={mode}", *experiment_overrides,
                *dataflex_arguments(block), *verl_extra]
    recorded = any(parse_override(argument).key == f"{RUN_BLOCK}.dir" for argument in verl_extra)
    return [sys.executable, "-m", RECORD_MODULE if recorded else VERL_ENTRY_MODULE, ROUTE_TRAINERS[mode],
            *ROUTE_OVERRIDES, *experiment_overrides, *dataflex_arguments(block), *verl_extra]


def _resolved(config: DictConfig, key: str) -> list[str]:
    try:
        return [str(item) for item in OmegaConf.to_container(OmegaConf.select(config, key), resolve=True)]
    except OmegaConfBaseException as error:
        raise ConfigError(f"{key}: cannot resolve: {error}") from None


def wandb_environment(group: str, tags: Sequence[str] = ()) -> dict[str, str]:
    return {WANDB_GROUP_VARIABLE: group, **({WANDB_TAGS_VARIABLE: ",".join(tags)} if tags else {})}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataflex_rl.verl.command",
                                     description="Print (or run) the verl command line of a verl experiment.")
    parser.add_argument("experiment", help="experiment file, or its name under conf/verl_experiment/")
    parser.add_argument("arguments", nargs="*", help="NAME=value, dataflex.KEY=value, or verl overrides")
    parser.add_argument("--run", action="store_true", help="run the command instead of printing it")
    options = parser.parse_args(argv)
    try:
        command = build_verl_command(options.experiment, (), options.arguments)
        environment = experiment_environment(options.experiment)
        # What the trainer refuses at build time is refused here, before anything is printed or launched.
        with quiet_verl_import():
            validate_overrides(verl_overrides_of(command), environment)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not options.run:
        print(shlex.join([*(f"{name}={value}" for name, value in environment.items()), *command]))
        return 0
    sys.stdout.flush()
    os.execve(command[0], command, {**os.environ, **environment})


def verl_overrides_of(command: Sequence[str]) -> list[str]:  # of python -m <module> <overrides>
    return list(command[list(command).index("-m") + 2:])


if __name__ == "__main__":
    raise SystemExit(main())
