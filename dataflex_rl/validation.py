"""The validation kit of every config boundary: :class:`ConfigError` and checks whose messages name the key, the
value and what is allowed. It imports nothing of the project, so any module may use it."""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_NAME_LENGTH", "SEED_MODULUS", "ConfigError", "build_params", "check_choice", "check_file_name",
           "check_int_at_least", "check_int_in_range", "check_keys", "check_non_negative_int", "check_number",
           "check_seed", "check_unit_interval", "to_plain", "unknown_keys"]

# Per-step RNG seeds are taken modulo this prime, so a larger run seed would repeat ``seed % SEED_MODULUS``'s runs.
SEED_MODULUS = 2**31 - 1
# A name the user gives a file or folder: room for a suffix and a hidden temp file's within NAME_MAX (255 bytes).
MAX_NAME_LENGTH = 128
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ConfigError(ValueError):
    """A configuration value is not allowed. The message names the key, the value and what is allowed."""


def to_plain(cfg: Any) -> Any:
    """A plain Python container from a ``DictConfig``/``ListConfig`` (resolved) or anything mapping-like."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, Mapping):
        return {key: to_plain(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_plain(value) for value in cfg]
    return cfg


def defaults_of(schema: type) -> dict[str, Any]:
    """A dataclass's field defaults as a plain config node (tuples as lists): what a ConfigStore node stores."""
    return {field.name: to_plain(field.default_factory() if field.default is dataclasses.MISSING else field.default)
            for field in dataclasses.fields(schema)
            if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING}


def unknown_keys(given: Any, allowed: Any) -> list[Any]:
    """The keys of ``given`` (a mapping or any iterable of keys) not in ``allowed``, in ``given``'s order."""
    return [key for key in given if key not in allowed]


def check_keys(where: str, given: Mapping[str, Any], allowed: tuple[str, ...] | list[str]) -> None:
    unknown = unknown_keys(given, allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)}; allowed keys: "
                          f"{', '.join(allowed) if allowed else '(none)'}")


def check_non_negative_int(key: str, value: Any) -> int:
    return check_int_at_least(key, value, 0)


def check_seed(key: str, value: Any) -> int:
    """A run seed: an integer in ``[0, SEED_MODULUS - 1]`` (see :data:`SEED_MODULUS`), booleans refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"{key} = {value!r} is not allowed: a seed is an integer in [0, {SEED_MODULUS - 1}]")
    if value >= SEED_MODULUS:
        same = int(value) % SEED_MODULUS
        raise ConfigError(f"{key} = {value!r} is not allowed: a seed is an integer in [0, {SEED_MODULUS - 1}] "
                          f"(the per-step seeds are taken mod 2^31 - 1 = {SEED_MODULUS}, so {value} would repeat "
                          f"the runs of seed {same})")
    return int(value)


def check_unit_interval(key: str, value: Any) -> float:
    """A finite real number in [0, 1] (booleans and strings are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a finite number in [0, 1]")
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be in [0, 1]")
    return float(value)


def check_file_name(key: str, value: Any, what: str) -> str:
    """``value`` if it is a file name of ASCII letters, digits, '.', '_', '-' that starts with a letter or digit (so
    never hidden, never '.', '..' or an option) and has at most :data:`MAX_NAME_LENGTH` characters."""
    if not isinstance(value, str) or not _FILE_NAME.fullmatch(value):
        raise ConfigError(f"{key} = {value!r} is not allowed: {what} is a file name of letters, digits, '.', '_' and "
                          f"'-', starting with a letter or digit")
    if len(value) > MAX_NAME_LENGTH:
        raise ConfigError(f"{key} = {value[:20]!r}... ({len(value)} characters) is not allowed: {what} has at most "
                          f"{MAX_NAME_LENGTH} characters")
    return value


def check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not allowed; allowed values: {', '.join(map(repr, allowed))}")
    return value


def build_params(where: str, params_cls: type, given: Mapping[str, Any] | None) -> Any:
    """A component's frozen ``Params`` from user params, refusing unknown keys."""
    given = {} if given is None else to_plain(given)
    if not isinstance(given, Mapping):
        raise ConfigError(f"{where} = {given!r} is not allowed: it must be a mapping of parameter names to values")
    allowed = [field.name for field in dataclasses.fields(params_cls)]
    check_keys(where, given, allowed)
    try:
        return params_cls(**given)
    except ConfigError as error:
        raise ConfigError(f"{where}.{error}") from None


def check_int_at_least(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be an integer >= {minimum}")
    return int(value)


def check_number(key: str, value: Any, *, minimum: float | None = None, exclusive: bool = False) -> float:
    """A finite real number, optionally ``> minimum`` (``exclusive``) or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a finite number")
    if minimum is not None and (float(value) <= minimum if exclusive else float(value) < minimum):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be {'>' if exclusive else '>='} {minimum}")
    return float(value) + 0.0  # + 0.0: -0.0 becomes 0.0, the one zero of names and records


def check_int_in_range(key: str, value: Any, minimum: int, maximum: int) -> int:
    check_int_at_least(key, value, minimum)
    if value > maximum:
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be an integer in [{minimum}, {maximum}]")
    return int(value)


SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("", "0", "false", "no", "off")


def parse_switch(key: str, value: Any) -> bool:
    """The one boolean parser: a bool, or text (any case) in :data:`SWITCH_ON` or :data:`SWITCH_OFF`."""
    if isinstance(value, bool):
        return value
    text = "" if value is None else str(value).strip().lower()
    if text in SWITCH_ON or text in SWITCH_OFF:
        return text in SWITCH_ON
    raise ConfigError(f"{key} = {value!r} is not allowed: it must be true or false; allowed: {', '.join(SWITCH_ON)} "
                      f"or {', '.join(repr(v) for v in SWITCH_OFF)}")
