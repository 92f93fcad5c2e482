"""Typed, validated configuration of the ``dataflex`` block.

The block users write (public interface)::

    dataflex:
      mechanism: reweight
      scorer:   {name: token_prob}
      actuator: {name: advantage_reweight, params: {alpha: 0.5}}
      warmup_step: 0

:func:`parse_dataflex_config` turns a dict or ``DictConfig`` into frozen dataclasses once, at the boundary, and
refuses bad input with a :class:`ConfigError` that names the key, the value and what is allowed. Component
parameters are checked by each component's own ``Params`` dataclass (see :mod:`dataflex_rl.scorers`,
:mod:`dataflex_rl.actuators`). :func:`build_mechanism` validates a block and builds its mechanism.

Imports point one way: this module checks names against the scorer, actuator and mechanism registries, and
:mod:`dataflex_rl.mechanism` never imports it (a mechanism only reads the validated dataclasses it is given).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.mechanism import MECHANISMS, Mechanism, staged_mechanism_names
from dataflex_rl.registry import RegistryError
from dataflex_rl.scorers import SCORERS

from dataflex_rl.validation import ConfigError, build_params, check_keys, check_non_negative_int, to_plain

TOP_LEVEL_KEYS = ("mechanism", "scorer", "actuator", "warmup_step")
COMPONENT_KEYS = ("name", "params")


@dataclasses.dataclass(frozen=True)
class ComponentConfig:
    """One swappable part: a registry ``name`` and its validated, frozen ``params``.

    ``validated``: the component's own ``Params`` instance the values were checked by (kept so the mechanism does
    not rebuild it; None when the config was built by hand, and never part of equality).
    """

    name: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    validated: Any = dataclasses.field(default=None, compare=False, repr=False)

    def make_params(self, params_cls: type) -> Any:
        """The component's ``Params``: the validated instance when it is one of ``params_cls``, else built now."""
        if isinstance(self.validated, params_cls):
            return self.validated
        return params_cls(**self.params)

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., "params": {...}}``: the block as a user writes it."""
        return {"name": self.name, "params": dict(self.params)}


@dataclasses.dataclass(frozen=True)
class DataflexConfig:
    """The whole ``dataflex`` block, validated. Build it with :func:`parse_dataflex_config`."""

    mechanism: str
    scorer: ComponentConfig
    actuator: ComponentConfig
    warmup_step: int = 0

    def __post_init__(self) -> None:
        check_non_negative_int("dataflex.warmup_step", self.warmup_step)

    def to_dict(self) -> dict[str, Any]:
        """The whole block as a plain nested dict (the form :func:`parse_dataflex_config` reads back)."""
        return {
            "mechanism": self.mechanism,
            "scorer": self.scorer.to_dict(),
            "actuator": self.actuator.to_dict(),
            "warmup_step": self.warmup_step,
        }


def parse_dataflex_config(cfg: Any) -> DataflexConfig:
    """Validate the ``dataflex`` block (dict, ``DictConfig`` or :class:`DataflexConfig`) into a DataflexConfig.

    Checks the component names against the registries, each component's params, and that the scorer's output
    fits what the actuator consumes and what the mechanism can drive.
    """
    if isinstance(cfg, DataflexConfig):
        return cfg
    raw = to_plain(cfg)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"dataflex = {raw!r} is not allowed: it must be a mapping with keys {TOP_LEVEL_KEYS}")
    check_keys("dataflex", raw, TOP_LEVEL_KEYS)

    def lookup(registry: Any, key: str, name: Any) -> Any:
        try:
            return registry.get(name)
        except RegistryError as error:
            raise ConfigError(f"{key} = {name!r} is not allowed: {error}") from None

    mechanism_name = raw.get("mechanism", "reweight")
    mechanism_cls = lookup(MECHANISMS, "dataflex.mechanism", mechanism_name)

    def component(key: str, registry: Any) -> tuple[ComponentConfig, type]:
        block = raw.get(key)
        if block is None:
            block = {"name": getattr(mechanism_cls, f"default_{key}")}
        if isinstance(block, str):  # shorthand `scorer: token_prob`
            block = {"name": block}
        if not isinstance(block, Mapping) or "name" not in block:
            raise ConfigError(f"dataflex.{key} = {block!r} is not allowed: it must be a mapping with a 'name'")
        check_keys(f"dataflex.{key}", block, COMPONENT_KEYS)
        cls = lookup(registry, f"dataflex.{key}.name", block["name"])
        params = build_params(f"dataflex.{key}.params", cls.Params, block.get("params"))
        frozen = MappingProxyType(dataclasses.asdict(params))
        return ComponentConfig(name=block["name"], params=frozen, validated=params), cls

    scorer, scorer_cls = component("scorer", SCORERS)
    actuator, actuator_cls = component("actuator", ACTUATORS)
    check_compatible(scorer_cls, actuator_cls, mechanism_cls)
    warmup = check_non_negative_int("dataflex.warmup_step", raw.get("warmup_step", 0))
    return DataflexConfig(mechanism=mechanism_name, scorer=scorer, actuator=actuator, warmup_step=warmup)


def check_compatible(scorer_cls: type, actuator_cls: type, mechanism_cls: type) -> None:
    """Refuse a scorer/actuator/mechanism combination whose shapes, signals or fields do not fit."""
    if scorer_cls.granularity not in actuator_cls.granularities:
        raise ConfigError(
            f"dataflex.scorer.name = {scorer_cls.name!r} produces a {scorer_cls.granularity}-level signal, but "
            f"dataflex.actuator.name = {actuator_cls.name!r} accepts only "
            f"{'/'.join(sorted(actuator_cls.granularities))}-level signals"
        )
    if scorer_cls.signal not in actuator_cls.signals:
        raise ConfigError(
            f"dataflex.scorer.name = {scorer_cls.name!r} produces a {scorer_cls.signal!r} signal, but "
            f"dataflex.actuator.name = {actuator_cls.name!r} consumes only {sorted(actuator_cls.signals)}"
        )
    missing = [field for field in scorer_cls.required_fields if field not in mechanism_cls.provided_fields]
    if missing:
        raise ConfigError(
            f"dataflex.scorer.name = {scorer_cls.name!r} requires batch field(s) {missing} that "
            f"dataflex.mechanism = {mechanism_cls.name!r} does not provide; it provides "
            f"{sorted(mechanism_cls.provided_fields)}"
        )
    if getattr(actuator_cls, "needs_stages", False) and not mechanism_cls.staged:
        raise ConfigError(
            f"dataflex.actuator.name = {actuator_cls.name!r} cannot drive dataflex.mechanism = "
            f"{mechanism_cls.name!r}: it splits the policy update in stages, which this mechanism does not; "
            f"use a staged mechanism ({', '.join(staged_mechanism_names()) or 'none registered'})"
        )
    if actuator_cls.name not in mechanism_cls.actuators_allowed and mechanism_cls.actuators_allowed != ("*",):
        raise ConfigError(
            f"dataflex.actuator.name = {actuator_cls.name!r} cannot drive dataflex.mechanism = "
            f"{mechanism_cls.name!r}; allowed actuators: {list(mechanism_cls.actuators_allowed)}"
        )


def build_mechanism(cfg: Any, *, compile: bool = False) -> Mechanism:
    """Validate the ``dataflex`` block (dict, ``DictConfig`` or :class:`DataflexConfig`) and build its mechanism.

    Raises :class:`ConfigError` naming the key, the value and what is allowed.
    ``compile=True`` fuses the hot path with ``torch.compile`` (worth it for large batches).
    """
    config = parse_dataflex_config(cfg)
    return MECHANISMS.get(config.mechanism)(config, compile=compile)
