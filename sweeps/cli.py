"""python -m sweeps [key=value ...]: run an alpha x seed sweep (make sweep), then its report. Keys (docs/sweeps.md):
alpha=0.0,0.25,0.5 seeds=1,2 name= steps= jobs= threads= backend=local|verl (its settings: local.steps=
local.sft_warm_start= | verl.experiment=) mechanisms= eta= launcher=process|slurm|ray (slurm.* ray.*)
extra=[trainer.lr=1e-3 key=a,b (an axis)] dry_run=true report=false; --cfg prints the composed config, --help this."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.compose import EXPERIMENT_GROUP, check_group_choice, compose_config
from dataflex_rl.overrides import Override, bare_assignment, hydra_value, parse_override, split_assignment
from dataflex_rl.validation import ConfigError
from sweeps.backends import get_backend, store_backend_options
from sweeps.sweep_config import (DEFAULT_BACKEND, DEFAULT_LAUNCHER, LIST_KEYS, SWEEP_CONF_DIR, available_experiments,
                           check_no_env_interpolation, check_no_underflow, check_sweep_name, foreign_settings_message,
                           parse_sweep_config, settings_blocks)
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
    """``a=1,b=2`` (every piece a ``key=value``) is two overrides, ``a=1,2`` one (a grid axis)."""
    overrides: list[str] = []
    for token in shlex.split(text):
        pieces = _split_top_level(token)
        overrides += pieces if len(pieces) > 1 and all("=" in piece for piece in pieces) else [token]
    return overrides


def normalize_argv(argv: Sequence[str]) -> list[str]:
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


def _holds_sweep(value: Any) -> bool:
    from hydra.core.override_parser.types import Sweep

    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else ()
    return isinstance(value, Sweep) or any(_holds_sweep(item) for item in items)


def check_override_syntax(given: str, item: str) -> Override | None:
    """Check one argument (as typed, as normalized) before Hydra composes; returns it read."""
    bare, value = bare_assignment(given)
    check_no_env_interpolation(f"{bare} = {value!r}", given)  # before Hydra or OmegaConf resolve it
    if value is None:
        return None  # Hydra's own message for a deletion (~key) or a bare word
    if bare != "extra":  # extra's overrides are checked one by one (sweeps.sweep_config.parse_extra)
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


def load_config(argv: Sequence[str], config_name: str = "default", allowed_extra_keys: Sequence[str] = ()):
    """(the composed config, the sweep config read from it)."""
    overrides = normalize_argv(argv)
    parsed = [check_override_syntax(given, item) for given, item in zip(argv, overrides, strict=True)]
    parsed = [item for item in parsed if item is not None]
    # the chosen launcher must have its conf file, and settings overrides must belong to the chosen owner
    chosen = {key: next((item.value for item in reversed(parsed) if item.key == key and item.value), default)
              for key, default in (("launcher", DEFAULT_LAUNCHER), ("backend", DEFAULT_BACKEND))}
    launcher_class(chosen["launcher"])
    if not (SWEEP_CONF_DIR / "launcher" / f"{chosen['launcher']}.yaml").is_file():
        raise ConfigError(f"launcher = {chosen['launcher']!r} is not allowed: it is registered but has no config "
                          f"file conf/sweeps/launcher/{chosen['launcher']}.yaml")
    get_backend(chosen["backend"])  # an unknown name raises, listing conf/backend/
    store_backend_options()
    blocks = settings_blocks()
    for item in parsed:
        owner = blocks.get(item.group)
        if item.value is not None and owner is not None and item.group != chosen[owner]:
            raise ConfigError(foreign_settings_message(item.key, item.written_value, chosen[owner]))
    for item in parsed:  # a group choice is a file name: refused before Hydra reads it as a path
        if item.key == EXPERIMENT_GROUP:
            check_group_choice(item, available_experiments())
    cfg = compose_config(config_name, overrides, SWEEP_CONF_DIR)
    return cfg, parse_sweep_config(cfg, allowed_extra_keys)


def split_cfg_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(whether ``--cfg`` was given, the other arguments); a section word after it is dropped."""
    rest, show = [], False
    for index, argument in enumerate(argv):
        if argument == "--cfg":
            show = True
        elif not (argument in ("job", "hydra", "all") and index and argv[index - 1] == "--cfg"):
            rest.append(argument)
    return show, rest


def main(argv: Sequence[str] | None = None, doc: str = __doc__, kind: str = "sweep", run: Any = None,
         config_name: str = "default", allowed_extra_keys: Sequence[str] = (), parse: Any = None) -> int:
    """A sweep driver's command line (``python -m sweeps``; the study's passes its own ``run`` and ``parse``)."""
    from omegaconf import OmegaConf

    from sweeps.driver import EXIT_REFUSED, run_sweep

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(doc.replace("``", "").replace("::", ":").strip())
        return 0
    show_config, argv = split_cfg_flag(argv)
    try:
        cfg, config = load_config(argv, config_name, allowed_extra_keys)
        config = parse(cfg) if parse is not None else config
    except ConfigError as error:
        print(f"error: {kind} refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if show_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    return (run or run_sweep)(config, argv)
