"""Build the ``python -m verl.trainer.main_ppo ...`` command line of a verl experiment.

An experiment file (``conf/verl_experiment/verl_*.yaml``) holds ``backend: verl``, a ``verl`` block of variables plus
an ``overrides`` list of verl Hydra overrides that use them (``${verl.model}``), and a ``dataflex`` block. The
command is::

    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=<trainer_mode> <overrides...> <trainer_modes.<mode>...>
        +dataflex.<key>=<value>... <extra verl overrides...>

``trainer_mode`` (a variable of the ``verl`` block, default ``dataflex_sync``) is one of :data:`TRAINER_MODES`; the
experiment's optional ``trainer_modes`` block gives each mode the verl overrides it needs (separate_async: the
rollout's own resource pool and checkpoint engine).

The dataflex block is validated here (the same :class:`ConfigError` as the trainer raises) and written out in
full, so verl's logged config holds every mechanism parameter. Usage::

    python -m dataflex_rl.verl.command conf/verl_experiment/verl_kk_3b.yaml model=/models/Qwen2.5-3B-Instruct \\
        data_dir=/data/kk dataflex.actuator.params.alpha=0.5 trainer.total_epochs=1          # prints it
    python -m dataflex_rl.verl.command verl_kk_3b model=... data_dir=... --run                  # runs it

Arguments: ``NAME=value`` sets a variable of the ``verl`` block (``verl.NAME=value`` too), ``dataflex.KEY=value``
(with or without a leading ``+``) changes the dataflex block, anything else is passed to verl after the
experiment's overrides, so it wins over them. Values are spliced into verl's Hydra overrides as written (quote a
path with spaces the Hydra way: ``model="'/my models/qwen'"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.config import parse_dataflex_config
from dataflex_rl.scorers import SCORERS
from dataflex_rl.overrides import hydra_value, parse_override, split_assignment
from dataflex_rl.validation import ConfigError, to_plain

TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
# The dataflex trainers (registered by dataflex_rl.verl.trainer, one per verl V1 mode) and the verl mode each runs as.
TRAINER_MODES = {"dataflex_sync": "sync", "dataflex_colocate_async": "colocate_async",
                 "dataflex_separate_async": "separate_async"}
DEFAULT_TRAINER_MODE = "dataflex_sync"
# The experiment variable that picks the trainer (``trainer_mode=dataflex_separate_async`` on the command line or in a
# sweep's extra), and the experiment's block of verl overrides per trainer mode, placed after its ``overrides``.
TRAINER_MODE_VARIABLE = "trainer_mode"
MODE_OVERRIDES_BLOCK = "trainer_modes"
VERL_ENTRY_MODULE = "verl.trainer.main_ppo"
EXPERIMENT_DIR = Path(__file__).resolve().parents[2] / "conf" / "verl_experiment"
# A Hydra override value that needs no quotes: an identifier-like word or a path, not a reserved word.
# An experiment's ``platform``: None (verl's own accelerator detection) or "cpu" (verl's CPU mode).
PLATFORMS = (None, "cpu")


def resolve_experiment(experiment: str | Path) -> Path:
    """The experiment file: an existing path, or a name under ``conf/verl_experiment/`` (``verl_kk_3b``)."""
    path = Path(experiment)
    if path.is_file():
        return path
    named = EXPERIMENT_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if named.is_file():
        return named
    available = sorted(p.stem for p in EXPERIMENT_DIR.glob("verl_*.yaml")) if EXPERIMENT_DIR.is_dir() else []
    raise ConfigError(
        f"experiment = {str(experiment)!r} is not allowed: no such file, and no {named.name} in {EXPERIMENT_DIR}; "
        f"verl experiments: {', '.join(available) or '(none)'}"
    )


def load_experiment(experiment: str | Path) -> DictConfig:
    """Load and check an experiment file (``backend: verl``, ``verl.overrides`` a list, a ``dataflex`` block)."""
    path = resolve_experiment(experiment)
    config = OmegaConf.load(path)
    if not isinstance(config, DictConfig) or config.get("backend") != "verl":
        found = config.get("backend") if isinstance(config, DictConfig) else None
        raise ConfigError(f"{path}: backend = {found!r} is not allowed: a verl experiment needs backend: verl")
    overrides = OmegaConf.select(config, "verl.overrides", throw_on_missing=False)
    if not OmegaConf.is_list(overrides):
        raise ConfigError(f"{path}: verl.overrides must be a list of verl overrides 'key=value'")
    if "dataflex" not in config:
        raise ConfigError(f"{path}: dataflex: missing; a verl experiment needs a dataflex block")
    for mode, overrides in (config.get(MODE_OVERRIDES_BLOCK) or {}).items():
        check_trainer_mode(mode, f"{path}: {MODE_OVERRIDES_BLOCK}.{mode}")
        if not OmegaConf.is_list(overrides):
            raise ConfigError(f"{path}: {MODE_OVERRIDES_BLOCK}.{mode} must be a list of verl overrides 'key=value'")
    platform = config.get("platform")
    if platform not in PLATFORMS:
        raise ConfigError(f"{path}: platform = {platform!r} is not allowed: one of {list(PLATFORMS)} "
                          f"(null: verl picks the accelerator; cpu: verl's CPU mode, dataflex_rl.verl.cpu)")
    return config


def check_trainer_mode(mode: Any, where: str = TRAINER_MODE_KEY) -> str:
    """``mode`` when it names a dataflex trainer, else a :class:`ConfigError` naming the key, value and choices."""
    if mode not in TRAINER_MODES:
        raise ConfigError(f"{where} = {mode!r} is not allowed: the dataflex trainers are {list(TRAINER_MODES)} "
                          f"(verl's modes {list(TRAINER_MODES.values())} with the mechanism)")
    return mode


def experiment_environment(experiment: str | Path | DictConfig) -> dict[str, str]:
    """The environment variables every verl process of the experiment needs: verl's CPU mode for
    ``platform: cpu`` (:data:`dataflex_rl.verl.cpu.ENVIRONMENT`), nothing otherwise."""
    config = experiment if isinstance(experiment, DictConfig) else load_experiment(experiment)
    if config.get("platform") == "cpu":
        from dataflex_rl.verl.cpu import ENVIRONMENT

        return dict(ENVIRONMENT)
    return {}


def split_arguments(config: DictConfig, arguments: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """Sort ``key=value`` arguments into (variables, dataflex overrides, verl overrides), keeping their order."""
    variable_names = [name for name in config.verl if name != "overrides"] + [TRAINER_MODE_VARIABLE]
    variables: dict[str, str] = {}
    dataflex_overrides: list[str] = []
    verl_overrides: list[str] = []
    for argument in arguments:
        override = parse_override(argument)
        name = override.key.removeprefix("verl.")
        if override.group == "dataflex":
            dataflex_overrides.append(argument)
        elif override.value is not None and not override.prefix and name in variable_names:
            variables[name] = split_assignment(argument)[1]  # the value as written: the template quotes it
        else:
            verl_overrides.append(argument)
    return variables, dataflex_overrides, verl_overrides


def merge_dataflex(block: Any, overrides: Sequence[str]) -> dict[str, Any]:
    """The experiment's dataflex block with ``dataflex.KEY=value`` overrides applied, validated, in full.

    An override that names another scorer or actuator (``dataflex.actuator.name=stapo``) keeps only the parameters
    the new component has too (AR's ``alpha`` stays for ``lopti``, whose parameters are AR's plus two; none of them
    for ``stapo``): the others would be refused as unknown to it.
    """
    merged = OmegaConf.create(to_plain(block))
    for text in overrides:
        override = parse_override(text, where=f"dataflex override {text!r}")
        if override.value is None or not override.key.startswith("dataflex."):
            raise ConfigError(
                f"dataflex override {text!r} is not allowed: write dataflex.KEY=value, "
                f"e.g. dataflex.actuator.params.alpha=0.5"
            )
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
    """``+dataflex.<key>=<value>`` for every leaf of the block (verl's config has no dataflex key, hence ``+``)."""
    arguments = []
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            arguments.extend(dataflex_arguments(value, f"{prefix}.{key}"))
        else:
            arguments.append(f"+{prefix}.{key}={hydra_value(value)}")
    return arguments


def build_verl_command(
    experiment: str | Path, dataflex_overrides: Sequence[str] = (), extra: Sequence[str] = ()
) -> list[str]:
    """The argv of ``python -m verl.trainer.main_ppo`` for an experiment.

    ``dataflex_overrides``: ``dataflex.KEY=value`` changes to the experiment's dataflex block (validated here).
    ``extra``: ``NAME=value`` for the experiment's variables (``model``, ``data_dir``, ``seed``, ``trainer_mode`` ...), more
    ``dataflex.*`` overrides, and verl overrides appended last. Raises :class:`ConfigError` for a bad dataflex
    value or a variable left unset.
    """
    config = load_experiment(experiment)
    variables, extra_dataflex, verl_extra = split_arguments(config, extra)
    for name, value in variables.items():
        config.verl[name] = value
    for name in config.verl:
        if OmegaConf.is_missing(config.verl, name):
            raise ConfigError(f"verl.{name}: missing; pass {name}=VALUE on the command line (e.g. {name}=/path)")
    try:
        experiment_overrides = [str(item) for item in OmegaConf.to_container(config.verl.overrides, resolve=True)]
    except OmegaConfBaseException as error:
        raise ConfigError(f"verl.overrides: cannot resolve: {error}") from None
    mode = check_trainer_mode(config.verl.get(TRAINER_MODE_VARIABLE, DEFAULT_TRAINER_MODE),
                              f"verl.{TRAINER_MODE_VARIABLE}")
    mode_overrides = OmegaConf.select(config, f"{MODE_OVERRIDES_BLOCK}.{mode}", default=None)
    try:
        if mode_overrides is not None:
            experiment_overrides += [str(item) for item in OmegaConf.to_container(mode_overrides, resolve=True)]
    except OmegaConfBaseException as error:
        raise ConfigError(f"{MODE_OVERRIDES_BLOCK}.{mode}: cannot resolve: {error}") from None
    block = merge_dataflex(config.dataflex, [*dataflex_overrides, *extra_dataflex])
    return [
        sys.executable,
        "-m",
        VERL_ENTRY_MODULE,
        f"{TRAINER_MODE_KEY}={mode}",
        *experiment_overrides,
        *dataflex_arguments(block),
        *verl_extra,
    ]


def wandb_environment(group: str, tags: Sequence[str] = ()) -> dict[str, str]:
    """Environment variables giving verl's W&B run a group and tags (verl's ``wandb.init`` reads them)."""
    environment = {"WANDB_RUN_GROUP": group}
    if tags:
        environment["WANDB_TAGS"] = ",".join(tags)
    return environment


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dataflex_rl.verl.command EXPERIMENT [ARGS] [--run]``: print the command (or replace this process
    with it); 2 with the error on a bad argument."""
    parser = argparse.ArgumentParser(
        prog="python -m dataflex_rl.verl.command",
        description="Print (or run) the verl command line of a verl experiment.",
    )
    parser.add_argument("experiment", help="experiment file, or its name under conf/verl_experiment/")
    parser.add_argument("arguments", nargs="*", help="NAME=value, dataflex.KEY=value, or verl overrides")
    parser.add_argument("--run", action="store_true", help="run the command instead of printing it")
    options = parser.parse_args(argv)
    try:
        command = build_verl_command(options.experiment, (), options.arguments)
        environment = experiment_environment(options.experiment)
        from dataflex_rl.verl.check import quiet_verl_import, validate_overrides

        # What the trainer refuses at build time (the dataflex block, a staged mechanism's LR schedule, the run
        # store block) is refused here, before anything is printed or launched.
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
    return 0  # not reached: execve replaces this process


def verl_overrides_of(command: Sequence[str]) -> list[str]:
    """The verl overrides of a ``build_verl_command`` argv (everything after ``-m verl.trainer.main_ppo``)."""
    return list(command[list(command).index(VERL_ENTRY_MODULE) + 1:])


if __name__ == "__main__":
    raise SystemExit(main())
