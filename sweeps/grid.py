"""The sweep grid: mechanism x alpha x eta x extra axes x seed, one :class:`RunSpec` per cell.

The grid is a list of typed axes (:class:`sweeps.config.Axis`, :func:`grid_axes`): the preset, alpha, eta, the
extra axes and the seed. Extra axes come from the ``extra`` overrides, read once by
:func:`sweeps.config.parse_extra`: an override in Hydra's sweep syntax (``trainer.lr=1e-4,1e-3``,
``task=choice(arithmetic,knights_knaves)``, ``trainer.kl_coef=range(0,3)``) is an axis, any other override is
common to every run. A :class:`RunSpec` carries its factor values; the backends, the warm-start grouping, the W&B
job type and the record read them, never override text.

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

from dataflex_rl.keys import ACTUATOR_PARAMS_PREFIX, ALPHA_KEY, ETA_KEY, WARM_START_SEED_KEY
from dataflex_rl.overrides import Override
from dataflex_rl.tracking.identity import factor_labels, run_label
from dataflex_rl.validation import ConfigError
from sweeps.config import PRESET_DIR, Axis, SweepConfig

MAX_RUN_NAME_BYTES = 255  # a run's folder name (NAME_MAX of the usual file systems)
PRESET_FACTOR = "mechanism_label"  # the preset axis's factor name (and the run config key that records it)
STANDARD_FACTORS = (PRESET_FACTOR, "alpha", "eta", "seed")  # the grid's own axes; the others come from ``extra``


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One cell of the grid: its ``name``, its ``factors`` (``{factor name: value}``, typed, in the grid's order:
    preset label, alpha, eta, extra axes, seed) and the grid ``axes`` that give them.

    ``axis_keys``: the config keys of every axis of the grid (``mechanism_label``, alpha's and eta's keys, the extra
    axes, ``seed``); the run records their values in ``meta.json`` (``RunIdentity.axes``). A warm start's spec has a
    name and no factors.
    """

    name: str
    factors: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    axes: tuple[Axis, ...] = ()
    axis_keys: tuple[str, ...] = ()
    warm_start_seed: int | None = None  # sft.seed of the run's own warm start (warm_start=per_seed), else None

    @property
    def seed(self) -> int:
        """The run's seed (0 for a warm start)."""
        return int(self.factors.get("seed", 0))

    @property
    def mechanism(self) -> str | None:
        """The preset, when the grid has a preset axis."""
        return self.factors.get(PRESET_FACTOR)

    @property
    def alpha(self) -> float | None:
        """Alpha, when the grid has an alpha axis."""
        return self.factors.get("alpha")

    @property
    def eta(self) -> float | None:
        """Eta, when the grid has an eta axis."""
        return self.factors.get("eta")

    @property
    def extra_factors(self) -> dict[str, Any]:
        """The extra axes' values (``{config key: value}``)."""
        return {axis.name: self.factors[axis.name] for axis in self.axes if axis.name not in STANDARD_FACTORS}

    def settings(self) -> list[tuple[Axis, Override]]:
        """Each axis with the override that gives this cell its value, in the grid's order (the preset axis also
        sets ``mechanism_label``, which records the preset in the run's config)."""
        pairs = []
        for axis in self.axes:
            pairs.append((axis, axis.override(self.factors[axis.name])))
            if axis.name == PRESET_FACTOR:
                pairs.append((axis, Override(PRESET_FACTOR, self.mechanism, text=f"{PRESET_FACTOR}={self.mechanism}")))
        return pairs

    @property
    def warm_start_overrides(self) -> tuple[str, ...]:
        """``sft.seed=<s>`` for a run with a warm start of its own (``warm_start=per_seed``), else nothing."""
        return warm_start_overrides(self.warm_start_seed)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The cell's own train overrides, as text (``dataflex=ar mechanism_label=ar ++...alpha=0.5 seed=1``, then
        the warm start's ``sft.seed=1`` under ``warm_start=per_seed``)."""
        return (*(str(override) for _, override in self.settings()), *self.warm_start_overrides)

    def describe(self) -> dict[str, object]:
        """The cell as sweep.json stores it."""
        return {"alpha": self.alpha, "seed": self.seed, "mechanism_label": self.mechanism, "eta": self.eta,
                "axes": self.extra_factors, "warm_start_seed": self.warm_start_seed}


def warm_start_seed(design: str, seed: int) -> int | None:
    """The ``sft.seed`` of a run of ``seed`` under the sweep's warm-start ``design``: the seed itself for
    ``per_seed`` (every arm of a seed shares it; seeds differ), None for ``shared`` (the configured ``sft.seed``)."""
    return seed if design == "per_seed" else None


def warm_start_overrides(warm_start_seed: int | None) -> tuple[str, ...]:
    """The overrides that give a run (or an SFT command) the warm start of ``warm_start_seed``: ``sft.seed=<s>``, or
    nothing for the shared warm start (``None``)."""
    return () if warm_start_seed is None else (f"{WARM_START_SEED_KEY}={warm_start_seed}",)


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


def grid_axes(config: SweepConfig) -> tuple[Axis, ...]:
    """The grid's axes, in naming order: preset, alpha, eta, the extra axes, seed (each only when the sweep names
    it; seed always). Alpha and eta are written ``++`` (set whether or not the preset has them, so the actuator's
    own check judges them)."""
    axes = [Axis(PRESET_FACTOR, "dataflex", config.mechanisms)] if config.mechanisms else []
    if config.alphas:
        axes.append(Axis("alpha", ALPHA_KEY, config.alphas, "++"))
    if config.eta:
        axes.append(Axis("eta", ETA_KEY, config.eta, "++"))
    return (*axes, *config.extra_axes, Axis("seed", "seed", config.seeds))


def _record_key(axis: Axis) -> str:
    """The run config key whose value records ``axis`` (the preset's label, the actuator parameter, the key)."""
    return PRESET_FACTOR if axis.name == PRESET_FACTOR else axis.key.split("@", 1)[0]


def expand_grid(config: SweepConfig) -> list[RunSpec]:
    """Every run of the sweep, in launch order (seeds innermost), names checked for uniqueness.

    An actuator parameter's axis (eta, or any ``dataflex.actuator.params.*`` key) applies only to the presets whose
    actuator has that parameter; the others (the baseline, say) run once, without it."""
    axes = grid_axes(config)
    axis_keys = tuple(_record_key(axis) for axis in axes)
    labels = factor_labels(list(dict.fromkeys(["alpha", "seed", PRESET_FACTOR, "eta", *(axis.name for axis in axes)])))
    mechanisms: Sequence[str | None] = config.mechanisms or (None,)
    specs: list[RunSpec] = []
    for mechanism in mechanisms:
        applying = [axis for axis in axes if axis.name in (PRESET_FACTOR, "alpha") or applies_to(mechanism, axis.key)]
        choices = [(mechanism,) if axis.name == PRESET_FACTOR else axis.values for axis in applying]
        for values in itertools.product(*choices):
            factors = dict(zip((axis.name for axis in applying), values, strict=True))
            # Launch order: seeds innermost, then the grid's order; the label lists alpha and seed first.
            ordered = {name: factors[name] for name in ("alpha", "seed") if name in factors} | factors
            specs.append(RunSpec(name=run_label(ordered, labels), factors=factors, axes=tuple(applying),
                                 axis_keys=axis_keys,
                                 warm_start_seed=warm_start_seed(config.warm_start, factors["seed"])))
    _check_names(config, [spec.name for spec in specs])
    return specs


def _check_names(config: SweepConfig, names: Sequence[str]) -> None:
    too_long = [name for name in names if len(name.encode()) > MAX_RUN_NAME_BYTES]
    if too_long:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: the run name {too_long[0][:40]!r}... has "
                          f"{len(too_long[0].encode())} bytes, a folder name at most {MAX_RUN_NAME_BYTES}; use "
                          f"shorter axis values")
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"extra = {list(config.extra)!r} is not allowed: two grid cells get the run name "
                          f"{duplicates[0]!r}; make the axis values distinct after turning unsafe characters into _")


def grid_description(config: SweepConfig) -> dict[str, object]:
    """The grid as sweep.json stores it."""
    return {"alpha": list(config.alphas), "seed": list(config.seeds), "mechanism": list(config.mechanisms),
            "eta": list(config.eta), "axes": {axis.key: list(axis.values) for axis in config.extra_axes},
            "common_overrides": [str(item) for item in config.common]}


def default_name(config: SweepConfig, prefix: str | None = None) -> str:
    """``<prefix>-<8 hex>``: the hash covers the grid and the overrides, so the same command finds (and resumes)
    the same sweep on any later day, while a different grid gets its own folder. The prefix defaults to the named
    experiment (``kk-1a2b3c4d``), else ``sweep``."""
    prefix = prefix or config.experiment or "sweep"
    identity = {"backend": config.backend, "alpha": list(config.alphas), "seeds": list(config.seeds),
                "mechanisms": list(config.mechanisms), "eta": list(config.eta), "extra": list(config.extra),
                "steps": config.steps, "train_module": config.train_module, "warm_start": config.warm_start}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    return f"{prefix}-{digest}"
