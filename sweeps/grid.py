"""The sweep grid: preset x alpha x eta x extra axes x seed, one :class:`RunSpec` per cell, named from its factors
(``a0.25-s1``, then one tag per other axis: ``ar``, ``eta0.1``, ``lr0.001``; docs/sweeps.md). An ``extra`` override
in Hydra's sweep syntax is an axis (:func:`sweeps.sweep_config.parse_extra`); a spec carries typed factor values."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Any

from dataflex_rl.keys import ACTUATOR_PARAMS_PREFIX, ALPHA_KEY, ETA_KEY, WARM_START_SEED_KEY
from dataflex_rl.hashing import stable_hash
from dataflex_rl.overrides import Override
from dataflex_rl.tracking.identity import check_distinct_arms, factor_labels, run_label
from dataflex_rl.validation import ConfigError
from sweeps.sweep_config import (PRESET_DIR, Axis, SweepConfig, extra_axes, grid_alphas, grid_presets, run_extra,
                                 run_steps)

# A run's name makes its folder and its longest file name, launch/<name>.yaml: NAME_MAX (255) less ".yaml".
MAX_RUN_NAME_BYTES = 255 - len(".yaml")
PRESET_FACTOR = "mechanism_label"  # the preset axis's factor name (and the run config key that records it)
STANDARD_FACTORS = (PRESET_FACTOR, "alpha", "eta", "seed")  # the grid's own axes; the others come from ``extra``


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of the grid; ``axis_keys``: the config keys of every axis (``meta.json``)."""

    name: str
    factors: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    axes: tuple[Axis, ...] = ()
    axis_keys: tuple[str, ...] = ()
    warm_start_seed: int | None = None  # sft.seed of the run's own warm start (warm_start=per_seed), else None

    @property
    def seed(self) -> int:
        return int(self.factors.get("seed", 0))  # 0 for a warm start

    @property
    def mechanism(self) -> str | None:
        return self.factors.get(PRESET_FACTOR)

    @property
    def alpha(self) -> float | None:
        return self.factors.get("alpha")

    @property
    def eta(self) -> float | None:
        return self.factors.get("eta")

    @property
    def extra_factors(self) -> dict[str, Any]:
        return {axis.name: self.factors[axis.name] for axis in self.axes if axis.name not in STANDARD_FACTORS}

    def settings(self) -> list[tuple[Axis, Override]]:
        """Each axis with its override (the preset axis also sets ``mechanism_label``)."""
        pairs = []
        for axis in self.axes:
            pairs.append((axis, axis.override(self.factors[axis.name])))
            if axis.name == PRESET_FACTOR:
                pairs.append((axis, Override(PRESET_FACTOR, self.mechanism, text=f"{PRESET_FACTOR}={self.mechanism}")))
        return pairs

    @property
    def warm_start_overrides(self) -> tuple[str, ...]:
        return warm_start_overrides(self.warm_start_seed)

    @property
    def overrides(self) -> tuple[str, ...]:
        return (*(str(override) for _, override in self.settings()), *self.warm_start_overrides)

    def describe(self) -> dict[str, object]:
        return {"alpha": self.alpha, "seed": self.seed, "mechanism_label": self.mechanism, "eta": self.eta,
                "axes": self.extra_factors, "warm_start_seed": self.warm_start_seed}


def warm_start_seed(design: str, seed: int) -> int | None:
    return seed if design == "per_seed" else None


def warm_start_overrides(warm_start_seed: int | None) -> tuple[str, ...]:
    return () if warm_start_seed is None else (f"{WARM_START_SEED_KEY}={warm_start_seed}",)


def applies_to(mechanism: str | None, key: str) -> bool:
    """An actuator parameter's axis applies only to presets whose actuator has that parameter."""
    if mechanism is None or not key.startswith(ACTUATOR_PARAMS_PREFIX):
        return True
    from omegaconf import OmegaConf

    from dataflex_rl.actuators import ACTUATORS
    from dataflex_rl.registry import RegistryError

    try:
        name = OmegaConf.select(OmegaConf.load(PRESET_DIR / f"{mechanism}.yaml"), "actuator.name", default=None)
        actuator = ACTUATORS.get(name)
    except RegistryError:  # the run's own config check names the bad actuator
        return False
    return key.removeprefix(ACTUATOR_PARAMS_PREFIX) in {field.name for field in dataclasses.fields(actuator.Params)}


def expand_grid(config: SweepConfig) -> list[RunSpec]:
    """Every run, seeds innermost; names unique and short enough for a folder."""
    # the axes: preset, alpha, eta, extra axes, seed; alpha and eta ``++`` (the actuator's check judges them)
    presets, alphas = grid_presets(config), grid_alphas(config)
    axes = [Axis(PRESET_FACTOR, "dataflex", presets)] if presets else []
    if alphas:
        axes.append(Axis("alpha", ALPHA_KEY, alphas, "++"))
    if config.eta:
        axes.append(Axis("eta", ETA_KEY, config.eta, "++"))
    axes += [*extra_axes(config), Axis("seed", "seed", config.seeds)]
    for axis in axes:
        try:
            check_distinct_arms(axis.name, axis.values)
        except ValueError as error:
            baseline = " (alpha = 0, the baseline, is in every grid)" if axis.name == "alpha" else ""
            raise ConfigError(f"{error}{baseline}") from None
    axis_keys = tuple(PRESET_FACTOR if axis.name == PRESET_FACTOR else axis.key.split("@", 1)[0] for axis in axes)
    cells = []
    for mechanism in presets or (None,):
        applying = [axis for axis in axes if axis.name in (PRESET_FACTOR, "alpha") or applies_to(mechanism, axis.key)]
        choices = [(mechanism,) if axis.name == PRESET_FACTOR else axis.values for axis in applying]
        for values in itertools.product(*choices):
            factors = dict(zip((axis.name for axis in applying), values, strict=True))
            cells.append((factors, tuple(applying), warm_start_seed(config.warm_start, factors["seed"])))
    labels = factor_labels(list(dict.fromkeys(["alpha", "seed", PRESET_FACTOR, "eta", *(axis.name for axis in axes)])))
    # the label lists alpha and seed first, then the grid's order
    names = [run_label({name: factors[name] for name in ("alpha", "seed") if name in factors} | factors, labels)
             for factors, _, _ in cells]
    too_long = [name for name in names if len(name.encode()) > MAX_RUN_NAME_BYTES]
    if too_long:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: the run name {too_long[0][:40]!r}... has "
                          f"{len(too_long[0].encode())} bytes, a run name at most {MAX_RUN_NAME_BYTES} (its longest "
                          f"file, launch/<name>.yaml, fits a file name's 255); use shorter axis values")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: two grid cells get the run name "
                          f"{duplicates[0]!r}; make the axis values distinct after turning unsafe characters into _")
    return [RunSpec(name=name, factors=factors, axes=applying, axis_keys=axis_keys, warm_start_seed=seed)
            for name, (factors, applying, seed) in zip(names, cells, strict=True)]


def default_name(config: SweepConfig, prefix: str | None = None) -> str:
    """``<prefix>-<8 hex of the grid and overrides>``: the same command resumes the same sweep."""
    prefix = prefix or config.experiment or "sweep"
    identity = {"backend": config.backend, "alpha": list(grid_alphas(config)), "seeds": list(config.seeds),
                "mechanisms": list(grid_presets(config)), "eta": list(config.eta), "extra": list(run_extra(config)),
                "steps": run_steps(config), "train_module": config.train_module, "warm_start": config.warm_start}
    return f"{prefix}-{stable_hash(identity, length=8)}"
