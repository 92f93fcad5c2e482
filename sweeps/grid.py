"""The sweep grid: mechanism x alpha x eta x extra axes x seed, one :class:`RunSpec` per cell.

Extra axes come from the ``extra`` overrides: an override in Hydra's sweep syntax (``trainer.lr=1e-4,1e-3``,
``task=choice(arithmetic,knights_knaves)``, ``trainer.kl_coef=range(0,3)``) is an axis, any other override is
common to every run. Parsing is Hydra's own (``OverridesParser``).

Run names: ``a<alpha>-s<seed>`` (``a0.25-s1``), then one tag per other axis: the preset name (``ar``),
``eta<value>``, and ``<last key part><value>`` for an extra axis (``lr0.001``; ``task-knights_knaves`` for a
non-numeric value; the full key when two axes share a last part).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.keys import ACTUATOR_PARAMS_PREFIX, ALPHA_KEY, ETA_KEY
from dataflex_rl.tracking.identity import factor_labels, format_number, run_label
from dataflex_rl.validation import ConfigError
from sweeps.config import PRESET_DIR, SweepConfig, check_no_env_interpolation

# Keys the driver sets for every run; giving them in ``extra`` would fight the grid or the run store layout.
MANAGED_KEYS = {
    "run_dir": "the driver puts each run in runs/<sweep>/<run>",
    "sweep": "use name=<sweep name>",
    "run_name": "the driver names runs after their grid cell",
    "seed": "use seeds=1,2",
    "mode": "the driver runs mode=sft itself (sft_warm_start=false turns it off)",
    "threads": "use threads=N (or jobs=N: threads = cores // jobs)",
    "mechanism_label": "use mechanisms=<preset>,... (the label follows the preset)",
    "axes": "the driver records the grid's axes itself",
    ALPHA_KEY: "use alpha=0.0,0.5",
}
MAX_RUN_NAME_BYTES = 255  # a run's folder name (NAME_MAX of the usual file systems)


@dataclasses.dataclass(frozen=True)
class Axis:
    """An extra grid axis: a config ``key`` (as written, ``+`` prefix kept) and its values as override strings."""

    key: str
    values: tuple[str, ...]

    @property
    def bare_key(self) -> str:
        """The config key without Hydra's ``+``/``~`` prefix."""
        return self.key.lstrip("+~")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of the grid. ``overrides`` are the cell's own train overrides (preset, alpha, eta, axes, seed).

    ``axis_keys``: the config keys of every axis of the grid (``mechanism_label``, alpha's and eta's keys, the extra
    axes, ``seed``); the run records their values in ``meta.json`` (``RunIdentity.axes``).
    """

    name: str
    seed: int
    alpha: float | None = None
    mechanism: str | None = None
    eta: float | None = None
    axes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    axis_keys: tuple[str, ...] = ()

    @property
    def axis_overrides(self) -> list[str]:
        """The extra-axis overrides alone (what decides the SFT warm start besides the common overrides)."""
        return [f"{key}={value}" for key, value in self.axes.items()]

    def describe(self) -> dict[str, object]:
        """The cell as sweep.json stores it."""
        return {"alpha": self.alpha, "seed": self.seed, "mechanism_label": self.mechanism, "eta": self.eta,
                "axes": dict(self.axes)}


def preset_has_param(preset: str, name: str) -> bool:
    """Whether the actuator of ``conf/dataflex/<preset>.yaml`` has a parameter ``name`` (set there or defaulted)."""
    from omegaconf import OmegaConf

    from dataflex_rl.actuators import ACTUATORS
    from dataflex_rl.registry import RegistryError

    block = OmegaConf.load(PRESET_DIR / f"{preset}.yaml")
    try:
        actuator = ACTUATORS.get(OmegaConf.select(block, "actuator.name", default=None))
    except RegistryError:  # the run's own config check names the bad actuator
        return False
    return name in {field.name for field in dataclasses.fields(actuator.Params)}


def applies_to(mechanism: str | None, key: str) -> bool:
    """Whether an axis on ``key`` varies runs of preset ``mechanism``: always, except an actuator parameter's axis
    (``dataflex.actuator.params.<name>``) for a preset whose actuator lacks that parameter."""
    if mechanism is None or not key.startswith(ACTUATOR_PARAMS_PREFIX):
        return True
    return preset_has_param(mechanism, key.removeprefix(ACTUATOR_PARAMS_PREFIX))


def parse_extra(extra: Sequence[str]) -> tuple[list[str], list[Axis]]:
    """Split ``extra`` into (common overrides, axes), refusing overrides of the keys the driver manages."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    common: list[str] = []
    axes: list[Axis] = []
    for item in extra:
        check_no_env_interpolation(f"extra = {item!r}", item)
        try:
            override = parser.parse_override(item)
        except HydraException as error:
            raise ConfigError(f"extra = {item!r} is not allowed: {error}") from None
        key = override.key_or_group
        if key in MANAGED_KEYS:
            raise ConfigError(f"extra = {item!r} is not allowed: {key} is set by the sweep driver; "
                              f"{MANAGED_KEYS[key]}")
        if override.is_sweep_override():
            if override.value_type in (ValueType.GLOB_CHOICE_SWEEP, ValueType.INTERVAL_SWEEP):
                raise ConfigError(f"extra = {item!r} is not allowed: an axis lists its values (key=a,b, "
                                  f"choice(a,b) or range(start,stop[,step])); glob(...) and interval(...) give no "
                                  f"list of values to run")
            values = tuple(dict.fromkeys(override.sweep_string_iterator()))
            if not values:
                raise ConfigError(f"extra = {item!r} is not allowed: the axis {key} has no values (an empty range "
                                  f"runs nothing); give at least one value, e.g. range(1,3)")
            if any(axis.bare_key == key for axis in axes):
                raise ConfigError(f"extra = {item!r} is not allowed: {key} is already an axis")
            axes.append(Axis(override.get_key_element(), values))
        else:
            common.append(item)
    return common, axes


def grid_axis_keys(config: SweepConfig, axes: Sequence[Axis]) -> tuple[str, ...]:
    """The config keys of the grid's axes, in naming order: preset label, alpha, eta, extra axes, seed.

    Each is an axis when the sweep names it (seed always is).
    """
    keys = ["mechanism_label"] if config.mechanisms else []
    if config.alphas:
        keys.append(ALPHA_KEY)
    if config.eta:
        keys.append(ETA_KEY)
    return (*keys, *(axis.bare_key for axis in axes), "seed")


def expand_grid(config: SweepConfig) -> list[RunSpec]:
    """Every run of the sweep, in launch order (seeds innermost), names checked for uniqueness."""
    _, axes = parse_extra(config.extra)
    labels = factor_labels(["alpha", "seed", "mechanism_label", "eta", *(axis.bare_key for axis in axes)])
    mechanisms: Sequence[str | None] = config.mechanisms or (None,)
    alphas: Sequence[float | None] = config.alphas or (None,)
    etas: Sequence[float | None] = config.eta or (None,)
    axis_values = [[(axis.key, value) for value in axis.values] for axis in axes]
    axis_keys = grid_axis_keys(config, axes)
    specs: list[RunSpec] = []
    cells = []
    for mechanism, alpha in itertools.product(mechanisms, alphas):
        # An actuator parameter's axis (eta, or any dataflex.actuator.params.* key) applies only to the presets whose
        # actuator has that parameter; the others (the baseline, say) run once, without it.
        mechanism_etas = etas if applies_to(mechanism, ETA_KEY) else (None,)
        mechanism_axes = [values if applies_to(mechanism, axis.bare_key) else [None]
                          for axis, values in zip(axes, axis_values, strict=True)]
        cells += [(mechanism, alpha, eta, tuple(item for item in cell if item is not None))
                  for eta, cell in itertools.product(mechanism_etas, itertools.product(*mechanism_axes))]
    for mechanism, alpha, eta, cell in cells:
        for seed in config.seeds:
            factors: dict[str, Any] = {} if alpha is None else {"alpha": alpha}
            factors["seed"] = seed
            overrides = []
            if mechanism is not None:
                factors["mechanism_label"] = mechanism
                overrides += [f"dataflex={mechanism}", f"mechanism_label={mechanism}"]
            if alpha is not None:
                # ``++`` sets the key whether or not the preset has it, so the actuator's own check judges it.
                overrides.append(f"++{ALPHA_KEY}={format_number(alpha)}")
            if eta is not None:
                factors["eta"] = eta
                overrides.append(f"++{ETA_KEY}={format_number(eta)}")
            for key, value in cell:
                factors[key.lstrip("+~")] = value
                overrides.append(f"{key}={value}")
            overrides.append(f"seed={seed}")
            specs.append(RunSpec(name=run_label(factors, labels), seed=seed, alpha=alpha, mechanism=mechanism, eta=eta,
                                 axes=dict(cell), overrides=tuple(overrides), axis_keys=axis_keys))
    names = [spec.name for spec in specs]
    too_long = [name for name in names if len(name.encode()) > MAX_RUN_NAME_BYTES]
    if too_long:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: the run name {too_long[0][:40]!r}... has "
                          f"{len(too_long[0].encode())} bytes, a folder name at most {MAX_RUN_NAME_BYTES}; use "
                          f"shorter axis values")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: two grid cells get the run name "
                          f"{duplicates[0]!r}; make the axis values distinct after turning unsafe characters into _")
    return specs


def grid_description(config: SweepConfig) -> dict[str, object]:
    """The grid as sweep.json stores it."""
    common, axes = parse_extra(config.extra)
    return {"alpha": list(config.alphas), "seed": list(config.seeds), "mechanism": list(config.mechanisms),
            "eta": list(config.eta), "axes": {axis.key: list(axis.values) for axis in axes},
            "common_overrides": common}


def default_name(config: SweepConfig, prefix: str | None = None) -> str:
    """``<prefix>-<8 hex>``: the hash covers the grid and the overrides, so the same command finds (and resumes)
    the same sweep on any later day, while a different grid gets its own folder. The prefix defaults to the named
    experiment (``kk-1a2b3c4d``), else ``sweep``."""
    prefix = prefix or config.experiment or "sweep"
    identity = {"backend": config.backend, "alpha": list(config.alphas), "seeds": list(config.seeds),
                "mechanisms": list(config.mechanisms), "eta": list(config.eta), "extra": list(config.extra),
                "steps": config.steps, "train_module": config.train_module}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    return f"{prefix}-{digest}"
