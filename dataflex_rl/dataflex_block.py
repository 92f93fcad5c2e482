"""The ``dataflex`` block validated once into frozen dataclasses (:func:`parse_dataflex_config`), refusing bad input
with a :class:`ConfigError` naming key, value and what is allowed; :func:`build_mechanism` builds its mechanism."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.mechanism import DEFAULT_MECHANISM, DEFAULT_SCORER, MECHANISMS, Mechanism, check_combination
from dataflex_rl.registry import RegistryError
from dataflex_rl.scorers import SCORERS
from dataflex_rl.validation import ConfigError, build_params, check_choice, check_keys, check_non_negative_int, to_plain

TOP_LEVEL_KEYS = ("mechanism", "scorer", "actuator", "warmup_step")
COMPONENT_KEYS = ("name", "params")


@dataclasses.dataclass(frozen=True)
class ComponentConfig:
    """One swappable part: a registry ``name`` and its validated, frozen ``params``."""

    name: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    validated: Any = dataclasses.field(default=None, compare=False, repr=False)

    def make_params(self, params_cls: type) -> Any:
        """The component's ``Params``: the validated instance when it is one of ``params_cls``, else built now."""
        if isinstance(self.validated, params_cls):
            return self.validated
        return params_cls(**self.params)

    def to_dict(self) -> dict[str, Any]:
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

    @property
    def alpha(self) -> float | None:
        return self.actuator.params.get("alpha")

    def to_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "scorer": self.scorer.to_dict(), "actuator": self.actuator.to_dict(),
                "warmup_step": self.warmup_step}


def parse_dataflex_config(cfg: Any) -> DataflexConfig:
    """Validate the ``dataflex`` block (dict, ``DictConfig`` or :class:`DataflexConfig`) into a DataflexConfig."""
    if isinstance(cfg, DataflexConfig):
        return cfg
    raw = to_plain(cfg)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"dataflex = {raw!r} is not allowed: it must be a mapping with keys {TOP_LEVEL_KEYS}")
    check_keys("dataflex", raw, TOP_LEVEL_KEYS)

    mechanism_name = check_choice("dataflex.mechanism", raw.get("mechanism", DEFAULT_MECHANISM), tuple(MECHANISMS))
    defaults = {"scorer": DEFAULT_SCORER, "actuator": MECHANISMS[mechanism_name]}

    def component(key: str, registry: Any) -> tuple[ComponentConfig, type]:
        block = raw.get(key)
        if block is None or isinstance(block, str):  # a string: the shorthand `scorer: token_prob`
            block = {"name": defaults[key] if block is None else block}
        if not isinstance(block, Mapping) or "name" not in block:
            raise ConfigError(f"dataflex.{key} = {block!r} is not allowed: it must be a mapping with a 'name'")
        check_keys(f"dataflex.{key}", block, COMPONENT_KEYS)
        try:
            cls = registry.get(block["name"])
        except RegistryError as error:
            raise ConfigError(f"dataflex.{key}.name = {block['name']!r} is not allowed: {error}") from None
        params = build_params(f"dataflex.{key}.params", cls.Params, block.get("params"))
        frozen = MappingProxyType(dataclasses.asdict(params))
        return ComponentConfig(name=block["name"], params=frozen, validated=params), cls

    scorer, scorer_cls = component("scorer", SCORERS)
    actuator, actuator_cls = component("actuator", ACTUATORS)
    check_combination(mechanism_name, scorer_cls, actuator_cls)
    warmup = check_non_negative_int("dataflex.warmup_step", raw.get("warmup_step", 0))
    return DataflexConfig(mechanism=mechanism_name, scorer=scorer, actuator=actuator, warmup_step=warmup)


def with_param_defaults(block: Any) -> Any:
    """The block with each known component's omitted params taken from its ``Params`` defaults, the one place they
    live, so that a run's record holds every value; anything else is left for :func:`parse_dataflex_config` to judge."""
    if not isinstance(block, Mapping):
        return block
    block = dict(block)
    for key, registry in (("scorer", SCORERS), ("actuator", ACTUATORS)):
        spec = block.get(key)
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or spec["name"] not in registry:
            continue
        params = spec.get("params") or {}
        if isinstance(params, Mapping):
            defaults = {field.name: field.default for field in dataclasses.fields(registry.get(spec["name"]).Params)
                        if field.default is not dataclasses.MISSING}
            block[key] = {**spec, "params": {**defaults, **params}}
    return block


def build_mechanism(cfg: Any, *, compile: bool = False) -> Mechanism:
    return Mechanism(parse_dataflex_config(cfg), compile=compile)


def dataflex_defaults() -> dict[str, Any]:
    """The block's defaults a preset of ``conf/dataflex/`` composes onto (stored with ``train_defaults``)."""
    return {"mechanism": DEFAULT_MECHANISM, "scorer": {"name": DEFAULT_SCORER, "params": {}},
            "warmup_step": DataflexConfig.warmup_step}
