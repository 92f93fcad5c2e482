"""python -m sweeps [key=value ...]: run an alpha x seed sweep (make sweep), then write its report.

Keys (conf/sweeps/default.yaml documents each):

    alpha=0.0,0.25,0.5  seeds=1,2  name=NAME  steps=N  jobs=N  threads=N  backend=local|verl
    mechanisms=baseline,ar  eta=0.1,0.5  extra=[trainer.lr=1e-3 trainer.kl_coef=0,0.01]
    launcher=process|slurm|ray  slurm.partition=gpu  ray.address=http://HOST:8265
    add_baseline=false  dry_run=true  report=false  root=runs

launcher=... picks conf/sweeps/launcher/<name>.yaml; slurm.* and ray.* are the settings of that launcher only.

extra holds train overrides for every run; one written as a Hydra sweep (key=a,b) is a grid axis.
--cfg (or Hydra's --cfg job) prints the composed sweep config and exits; --help prints this text.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import shlex
from collections.abc import Mapping
from typing import Any

from dataflex_rl.local.cli import EXPERIMENT_GROUP, check_group_choice
from dataflex_rl.overrides import Override, hydra_value, parse_override, split_assignment, unknown_override_message
from dataflex_rl.validation import ConfigError
from sweeps.config import (
    DEFAULT_LAUNCHER,
    LIST_KEYS,
    SWEEP_CONF_DIR,
    available_experiments,
    check_no_env_interpolation,
    check_no_underflow,
    check_sweep_name,
    foreign_settings_message,
    parse_sweep_config,
    settings_blocks,
)
from sweeps.launchers import launcher_class


def _split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split at ``separator`` outside brackets, braces, parentheses and quotes."""
    pieces, depth, quote, current = [], 0, "", []
    for character in text:
        if quote:
            quote = "" if character == quote else quote
        elif character in "'\"":
            quote = character
        elif character in "[{(":
            depth += 1
        elif character in "]})":
            depth -= 1
        elif character == separator and depth == 0:
            pieces.append("".join(current))
            current = []
            continue
        current.append(character)
    pieces.append("".join(current))
    return pieces


def split_extra(text: str) -> list[str]:
    """Overrides from ``make sweep EXTRA=...``: separated by spaces; ``a=1,b=2`` (every piece a ``key=value``) is
    two overrides, while ``a=1,2`` stays one (a Hydra sweep over ``a``: a grid axis)."""
    overrides: list[str] = []
    for token in shlex.split(text):
        pieces = _split_top_level(token)
        if len(pieces) > 1 and all("=" in piece for piece in pieces):
            overrides.extend(pieces)
        else:
            overrides.append(token)
    return overrides


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Rewrite the command-line conveniences (module doc) into Hydra's override grammar."""
    normalized = []
    for argument in argv:
        key, value = split_assignment(argument)
        if value is not None and key in LIST_KEYS and "," in value and not value.lstrip().startswith("["):
            argument = f"{key}=[{value}]"
        elif value is not None and key == "extra":
            stripped = value.strip()
            inner = stripped[1:-1] if stripped.startswith("[") and stripped.endswith("]") else stripped
            if not inner.lstrip().startswith(("'", '"')):  # already Hydra's quoted list: leave it
                argument = "extra=[" + ",".join(hydra_value(item) for item in split_extra(inner)) + "]"
        normalized.append(argument)
    return normalized


def check_launcher_overrides(parsed: Sequence[Override]) -> None:
    """Before composing: the chosen launcher (the last ``launcher=``) must be registered and have its
    ``conf/sweeps/launcher/<name>.yaml``, and settings overrides must belong to it (``slurm.*`` needs
    ``launcher=slurm``): :class:`ConfigError` naming the key, the value and what is allowed."""
    chosen = next((item.value for item in reversed(parsed) if item.key == "launcher" and item.value), DEFAULT_LAUNCHER)
    launcher_class(chosen)
    if not (SWEEP_CONF_DIR / "launcher" / f"{chosen}.yaml").is_file():
        raise ConfigError(f"launcher = {chosen!r} is not allowed: it is registered but has no config file "
                          f"conf/sweeps/launcher/{chosen}.yaml")
    for item in parsed:
        if item.value is not None and item.group in settings_blocks() and item.group != chosen:
            raise ConfigError(foreign_settings_message(item.key, split_assignment(item.text)[1], chosen))


def _holds_sweep(value: Any) -> bool:
    from hydra.core.override_parser.types import Sweep

    if isinstance(value, Sweep):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_sweep(item) for item in value)
    if isinstance(value, Mapping):
        return any(_holds_sweep(item) for item in value.values())
    return False


def check_override_syntax(given: str, item: str) -> Override | None:
    """One command-line argument (``given``, as typed; ``item``, as normalized) must be an override Hydra's grammar
    reads, and a list key's value a list of values (no ``range(...)``): :class:`ConfigError` naming the key and the
    value as typed, before Hydra composes anything. Returns it read (None for a deletion or a bare word)."""
    key, value = split_assignment(given)
    bare = key.lstrip("+~")
    check_no_env_interpolation(f"{bare} = {value!r}", given)  # before Hydra or OmegaConf resolve it
    if value is None:
        return None  # Hydra's own message for a deletion (~key) or a bare word
    if bare != "extra":  # extra's overrides are checked one by one (sweeps.config.parse_extra)
        check_no_underflow(f"{bare} = {value!r}", value)
    try:
        override = parse_override(item, where=f"{bare} = {value!r}")
    except ConfigError as error:
        if bare == "name":
            check_sweep_name(value)
        raise ConfigError(f"{error}; quote a value holding spaces or any of ()[]{{}},;:=$'\" "
                          f"(e.g. {bare}=\"'a b'\")") from None
    if bare in LIST_KEYS and (override.sweep is not None or _holds_sweep(override.typed)):
        raise ConfigError(f"{bare} = {value!r} is not allowed: give the values themselves, e.g. {bare}=1,2 "
                          f"(sweep functions such as range(...) or choice(...) are for extra axes: "
                          f"extra=[key=range(1,4)])")
    return override


def compose_config(config_name: str, argv: Sequence[str]) -> Any:
    """Compose ``conf/sweeps/<config_name>.yaml`` with the (normalized) overrides; Hydra's errors become
    :class:`ConfigError`."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = normalize_argv(argv)
    parsed = [check_override_syntax(given, item) for given, item in zip(argv, overrides, strict=True)]
    check_launcher_overrides([item for item in parsed if item is not None])
    for item in parsed:  # a group choice is a file name: refused before Hydra reads it as a path
        if item is not None:
            if item.key == EXPERIMENT_GROUP:
                check_group_choice(item, available_experiments())
    with initialize_config_dir(config_dir=str(SWEEP_CONF_DIR), version_base="1.3"):
        try:
            return compose(config_name=config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException, ValueError) as error:  # ValueError: a group set to null
            unknown = unknown_override_message(
                error, overrides, lambda others: compose(config_name=config_name, overrides=others))
            if unknown:
                raise ConfigError(unknown) from None
            raise ConfigError(f"bad sweep override in {' '.join(overrides)}: {error}") from None


def load_config(argv: Sequence[str], config_name: str = "default", allowed_extra_keys: Sequence[str] = ()):
    """Compose ``conf/sweeps/<config_name>.yaml`` with ``argv`` and validate it (raises ConfigError)."""
    cfg = compose_config(config_name, argv)
    return cfg, parse_sweep_config(cfg, allowed_extra_keys)


CFG_SECTIONS = ("job", "hydra", "all")


def split_cfg_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(whether ``--cfg`` was given, the other arguments); Hydra's section word after it (``--cfg job``) is
    accepted and dropped, since the sweep drivers compose only their own config."""
    rest: list[str] = []
    show = False
    arguments = list(argv)
    for index, argument in enumerate(arguments):
        if argument == "--cfg":
            show = True
        elif show and argument in CFG_SECTIONS and index and arguments[index - 1] == "--cfg":
            continue
        else:
            rest.append(argument)
    return show, rest


def help_text(doc: str) -> str:
    """A module docstring as plain terminal text (reStructuredText's double backticks and ``::`` removed)."""
    return doc.replace("``", "").replace("::", ":").strip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (see :func:`sweeps.driver.run_sweep`)."""
    from omegaconf import OmegaConf

    from sweeps.driver import EXIT_REFUSED, run_sweep

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(__doc__), end="")
        return 0
    show_config, argv = split_cfg_flag(argv)
    try:
        cfg, config = load_config(argv)
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if show_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    return run_sweep(config, argv)
