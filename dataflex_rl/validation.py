"""Validation helpers every config boundary uses: :class:`ConfigError` and the checks that build its messages.

One kit for the ``dataflex`` schema (:mod:`dataflex_rl.config`), the components' ``Params``, the local backend's
config, the logger config, the verl run block and the sweep driver: each check refuses a bad value with a message
that names the key, the value and what is allowed. Nothing here imports a component, so any module may use it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["SEED_MODULUS", "ConfigError", "build_params", "check_choice", "check_int_at_least", "check_keys",
           "check_non_negative_int", "check_number", "check_seed", "check_unit_interval", "to_plain", "unknown_keys",
           "unknown_override_message"]

# A run's per-step RNG seeds are taken modulo this prime (:func:`dataflex_rl.local.trainer.step_seed`), so a run seed
# is allowed in [0, SEED_MODULUS - 1] only: there distinct seeds give distinct per-step seeds, while a larger seed
# repeats the runs of ``seed % SEED_MODULUS`` bit for bit.
SEED_MODULUS = 2**31 - 1


class ConfigError(ValueError):
    """A configuration value is not allowed. The message names the key, the value and what is allowed."""


def to_plain(cfg: Any) -> Any:
    """A plain Python container from a ``DictConfig``/``ListConfig`` (resolved) or anything mapping-like."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # omegaconf is a dependency; this only keeps the core importable without it
        DictConfig = ListConfig = ()  # type: ignore[assignment,misc]
    if DictConfig and isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    if isinstance(cfg, Mapping):
        return {key: to_plain(value) for key, value in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_plain(value) for value in cfg]
    return cfg


def unknown_keys(given: Any, allowed: Any) -> list[Any]:
    """The keys of ``given`` (a mapping or any iterable of keys) that are not in ``allowed``, in ``given``'s order:
    the one unknown-key test every config check builds its own message on."""
    return [key for key in given if key not in allowed]


def check_keys(where: str, given: Mapping[str, Any], allowed: tuple[str, ...] | list[str]) -> None:
    """Refuse keys of ``given`` that are not in ``allowed``."""
    unknown = unknown_keys(given, allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)}; allowed keys: "
            f"{', '.join(allowed) if allowed else '(none)'}"
        )


def check_non_negative_int(key: str, value: Any) -> int:
    """An integer >= 0 (booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be an integer >= 0")
    return int(value)


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


def check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not allowed; allowed values: {', '.join(map(repr, allowed))}")
    return value


def build_params(where: str, params_cls: type, given: Mapping[str, Any] | None) -> Any:
    """Instantiate a component's frozen ``Params`` dataclass from user params, refusing unknown keys.

    ``Params.__post_init__`` checks the values themselves (with ``where`` unknown to it, so errors are re-raised
    with the full key path).
    """
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
    """An integer >= ``minimum`` (booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be an integer >= {minimum}")
    return int(value)


def check_number(key: str, value: Any, *, minimum: float | None = None, exclusive: bool = False) -> float:
    """A finite real number, optionally ``> minimum`` (``exclusive``) or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a finite number")
    if minimum is not None and (float(value) <= minimum if exclusive else float(value) < minimum):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be {'>' if exclusive else '>='} {minimum}")
    return float(value)


_NOT_IN_CONFIG = re.compile(r"Could not override '([^']+)'")


def unknown_override_message(error: BaseException, overrides: list[str] | tuple[str, ...],
                             compose: Any) -> str | None:
    """For Hydra's refusal of an override whose key the config lacks (``Could not override 'trainer.lrr'``, which
    suggests ``+trainer.lrr``, refused in turn): ``"trainer.lrr = '1e-3' is not allowed: trainer has no key 'lrr';
    allowed keys of trainer: ..."``. ``compose(overrides)`` composes the config with the other overrides (the keys
    listed are those of the groups they pick). None for any other error."""
    found = _NOT_IN_CONFIG.search(str(error))
    if not found:
        return None
    key = found.group(1)
    given = [item for item in overrides if item.lstrip("+~").split("=", 1)[0] == key]
    value = given[-1].split("=", 1)[1] if given and "=" in given[-1] else None
    parent, _, leaf = key.rpartition(".")
    try:
        from omegaconf import DictConfig, OmegaConf

        base = compose([item for item in overrides if item not in given])
        node = OmegaConf.select(base, parent) if parent else base
        allowed = [str(name) for name in node.keys()] if isinstance(node, DictConfig) else None
    except Exception:  # noqa: BLE001  (the listing is a courtesy; the refusal stands without it)
        allowed = None
    where = parent or "the config"
    if allowed is None:
        return f"{key} = {value!r} is not allowed: {where} has no key {leaf!r}"
    return (f"{key} = {value!r} is not allowed: {where} has no key {leaf!r}; allowed keys"
            f"{' of ' + parent if parent else ''}: {', '.join(allowed)}")


# Hydra override values: text that needs no quotes, and words Hydra would read as another type.
_PLAIN_VALUE = re.compile(r"[A-Za-z_/][\w\-./]*")
_HYDRA_RESERVED = {"true", "false", "null", "nan", "inf", "-inf"}


def hydra_value(value: Any) -> str:
    """``value`` written in Hydra's override grammar, strings quoted only when they need it (the one quoter of
    override values: sweep commands, paths, verl arguments)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN_VALUE.fullmatch(text) and text.lower() not in _HYDRA_RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
