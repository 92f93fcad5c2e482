"""The sweep driver's configuration, typed once at the entry point: :class:`SweepConfig` is the schema and holds
every default (Hydra's ConfigStore node ``sweep_schema``, which ``conf/sweeps/default.yaml`` composes); a bad value
raises :class:`~dataflex_rl.validation.ConfigError` naming the key, the value and what is allowed."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from dataflex_rl.keys import ALPHA_KEY, BASELINE_ALPHA, BASELINE_PRESET, WARM_START_DESIGNS, WARM_START_SEED_KEY
from dataflex_rl.compose import EXPERIMENT_GROUP, run_experiments
from dataflex_rl.overrides import Override, hydra_value, parse_override
from dataflex_rl.validation import (ConfigError, build_params, check_choice, check_file_name, check_int_at_least,
                                    check_number, check_seed, parse_switch, to_plain)
from sweeps.backends import backend_settings_blocks, get_backend
from sweeps.launchers import LAUNCHERS as LAUNCHER_REGISTRY, launcher_class, parse_settings

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SWEEP_CONF_DIR = CONF_DIR / "sweeps"
PRESET_DIR = CONF_DIR / "dataflex"
DEFAULT_LAUNCHER = "process"
DEFAULT_BACKEND = "local"
LIST_KEYS = ("alpha", "seeds", "mechanisms", "eta")
DEFAULT_ALPHA = (0.0, 0.5)
# A seed plan (target_mde) never runs more seeds than this unless max_seeds says otherwise.
DEFAULT_MAX_SEEDS = 20


# Threads of a lone run: a step at 2 took 4-27x as long as at 1 on 2 shared cores (benchmarks/bench_local.py).
SINGLE_RUN_THREADS = 1


def check_sweep_name(name: str, key: str = "name") -> str:
    """``name`` if it is a folder name (:func:`~dataflex_rl.validation.check_file_name`)."""
    return check_file_name(key, name, "a sweep name")


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_presets() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def available_experiments() -> list[str]:
    """Names with both ``conf/experiment/<name>.yaml`` and ``conf/sweeps/experiment/<name>.yaml``."""
    sweeps = {path.stem for path in (SWEEP_CONF_DIR / EXPERIMENT_GROUP).glob("*.yaml")}
    return [name for name in run_experiments() if name in sweeps]


# Keys the driver sets for every run; giving them in ``extra`` would fight the grid or the run store layout.
MANAGED_KEYS = {
    "run_dir": "the driver puts each run in runs/<sweep>/<run>",
    "sweep": "use name=<sweep name>",
    "run_name": "the driver names runs after their grid cell",
    "seed": "use seeds=1,2",
    "mode": "the driver runs mode=sft itself (local.sft_warm_start=false turns it off)",
    "threads": "use threads=N (or jobs=N: threads = cores // jobs)",
    "mechanism_label": "use mechanisms=<preset>,... (the label follows the preset)",
    "axes": "the driver records the grid's axes itself",
    "warm_start": "use the sweep key warm_start=per_seed|shared (the driver records it in each run)",
    ALPHA_KEY: "use alpha=0.0,0.5",
}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One grid factor: its ``name`` in run names and records, the config ``key`` its override sets."""

    name: str
    key: str
    values: tuple[Any, ...]
    prefix: str = ""

    def override(self, value: Any) -> Override:
        text = value if isinstance(value, str) else hydra_value(value)
        return Override(self.key, text, self.prefix, text=f"{self.prefix}{self.key}={text}")


def parse_extra(extra: Sequence[str], check: Callable[[Override], None] | None = None
                ) -> tuple[tuple[Override, ...], tuple[Axis, ...]]:
    """Split ``extra`` into (common overrides, axes); each override is given to ``check``."""
    common: list[Override] = []
    axes: list[Axis] = []
    for item in extra:
        check_no_env_interpolation(f"extra = {item!r}", item)
        check_no_underflow(f"extra = {item!r}", item)
        override = parse_override(item, where=f"extra = {item!r}")
        if check is not None:
            check(override)
        if override.key in MANAGED_KEYS:
            raise ConfigError(f"extra = {item!r} is not allowed: {override.key} is set by the sweep driver; "
                              f"{MANAGED_KEYS[override.key]}")
        if override.sweep is None:
            common.append(override)
            continue
        if not override.sweep:
            raise ConfigError(f"extra = {item!r} is not allowed: the axis {override.key} has no values (an empty "
                              f"range runs nothing); give at least one value, e.g. range(1,3)")
        if any(axis.key == override.key for axis in axes):
            raise ConfigError(f"extra = {item!r} is not allowed: {override.key} is already an axis")
        package = f"@{override.package}" if override.package else ""
        axes.append(Axis(override.key, override.key + package, override.sweep, override.prefix))
    return tuple(common), tuple(axes)


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """One sweep: the grid and how to run it; each default below is the only one (docs/sweeps.md)."""

    name: str | None = None  # folder <root>/<name>/ and W&B group; None: sweep-<hash of the grid and overrides>
    root: str = "runs"
    experiment: str | None = None  # set by conf/sweeps/experiment/<name>.yaml: runs composed with experiment=<name>
    alpha: tuple[float, ...] | None = None  # None: DEFAULT_ALPHA, or with mechanisms each preset's own alpha (())
    # 2 alphas x 8 seeds x 120 steps: about 11 minutes on 2 cores (docs/results/default.md).
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    add_baseline: bool = True  # add alpha = 0 (or the baseline preset) when the grid lacks it
    mechanisms: tuple[str, ...] = ()  # dataflex presets conf/dataflex/<name>.yaml as an axis
    eta: tuple[float, ...] = ()
    extra: tuple[str, ...] = ()  # train overrides for every run; one in Hydra sweep syntax (key=a,b) is an axis
    steps: int | None = None  # RL steps per run (the backend's steps key); None: default_steps of the backend
    target_mde: float | None = None  # a difference to detect: the seeds are a pilot, then seeds are added
    max_seeds: int | None = None  # with target_mde: DEFAULT_MAX_SEEDS when None; without it, must stay None
    plan_metric: str = "val/accuracy"
    backend: str = DEFAULT_BACKEND  # conf/backend/<name>.yaml
    launcher: str = DEFAULT_LAUNCHER  # conf/sweeps/launcher/<name>.yaml
    jobs: int | None = None  # runs at once; None: the core count (process launcher) or every run
    threads: int | None = None  # torch/OpenMP threads per run; None: SINGLE_RUN_THREADS or the launcher's
    dry_run: bool = False
    report: bool = True
    warm_start: str = "per_seed"  # per_seed: seed s's runs start from the warm start of sft.seed = s; shared
    validate: bool = True  # compose and validate every run's config first (off only for stand-in trainers)
    train_module: str = "dataflex_rl.local.train"
    grace_s: float = 30.0  # seconds between SIGTERM and SIGKILL when stopping runs
    poll_s: float = 0.25
    launcher_settings: Any = None  # the launcher's typed ``<launcher>:`` block (sweeps/launchers/), None if it has none
    backend_settings: Any = None  # the backend's typed ``<backend>:`` block (Backend.settings), None if it has none


# --- what the config implies, computed where it is used (the grid, the plan), never stored on the config --------------
def run_extra(config: SweepConfig) -> tuple[str, ...]:
    """``extra`` with a named experiment's ``experiment=<name>`` first."""
    named = f"experiment={config.experiment}"
    return config.extra if config.experiment is None or named in config.extra else (named, *config.extra)


@functools.cache
def read_extra(extra: tuple[str, ...], backend: str) -> tuple[tuple[Override, ...], tuple[Axis, ...]]:
    """``(the overrides every run shares, the extra axes)``, read and checked once per sweep (:func:`parse_extra`)."""
    return parse_extra(extra, get_backend(backend).check_extra)


def common_overrides(config: SweepConfig) -> tuple[Override, ...]:
    return read_extra(run_extra(config), config.backend)[0]


def extra_axes(config: SweepConfig) -> tuple[Axis, ...]:
    return read_extra(run_extra(config), config.backend)[1]


def common_sets(config: SweepConfig, key: str) -> bool:
    return any(item.key == key for item in common_overrides(config))


def grid_alphas(config: SweepConfig) -> tuple[float, ...]:
    """The alpha axis: :data:`DEFAULT_ALPHA` unless given (none with presets), the baseline's 0 first when missing."""
    alpha = (() if config.mechanisms else DEFAULT_ALPHA) if config.alpha is None else config.alpha
    return (BASELINE_ALPHA, *alpha) if alpha and config.add_baseline and BASELINE_ALPHA not in alpha else alpha


def grid_presets(config: SweepConfig) -> tuple[str, ...]:
    """The preset axis with the baseline preset first when missing."""
    presets = config.mechanisms
    return (BASELINE_PRESET, *presets) if presets and config.add_baseline and BASELINE_PRESET not in presets \
        else presets


def run_steps(config: SweepConfig) -> int | None:
    """A run's RL steps: ``steps``, else the backend's default (None: the run config's own)."""
    return config.steps if config.steps is not None else get_backend(config.backend).default_steps(config)


def plan_cap(config: SweepConfig) -> int:
    """The most seeds a planned sweep gives a cell: ``max_seeds``, else :data:`DEFAULT_MAX_SEEDS`."""
    return config.max_seeds or DEFAULT_MAX_SEEDS


def _as_list(key: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, Mapping):
        raise ConfigError(f"{key} = {value!r} is not allowed: give a value or a list, e.g. {key}=1,2")
    return [value]


def _parse_number(key: str, value: Any) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    return check_number(key, value)


def _unique(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


def _int_text(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


SWEEP_KEYS = tuple(field.name for field in dataclasses.fields(SweepConfig)
                   if field.init and field.name not in ("launcher_settings", "backend_settings"))


# conf/sweeps/default.yaml composes this node, then the backend's and launcher's options and a named experiment's grid.
ConfigStore.instance().store(name="sweep_schema", node={
    "defaults": ["_self_", {"backend": DEFAULT_BACKEND}, {"launcher": DEFAULT_LAUNCHER}, {"experiment": None}],
    **{name: list(default) if isinstance(default := getattr(SweepConfig, name), tuple) else default
       for name in SWEEP_KEYS}})


def settings_blocks() -> dict[str, str]:
    """Each settings block of the sweep config -> the key that chooses its owner (``launcher`` or ``backend``)."""
    launchers = [name for name in LAUNCHER_REGISTRY.names() if LAUNCHER_REGISTRY.get(name).settings is not None]
    return {**dict.fromkeys(launchers, "launcher"), **dict.fromkeys(backend_settings_blocks(), "backend")}


def foreign_settings_message(key: str, value: Any, chosen: str) -> str:
    """The refusal of ``key`` (in another launcher's or backend's block than the ``chosen`` one)."""
    block = key.split(".", 1)[0]
    owner = settings_blocks()[block]
    if owner == "launcher":
        where = f"conf/sweeps/launcher/{block}.yaml"
    else:
        settings = get_backend(block).settings
        where = f"{settings.__name__} in {settings.__module__.replace('.', '/')}.py"
    return (f"{key} = {value!r} is not allowed with {owner}={chosen}: {block}.* are the settings of "
            f"{owner}={block} ({where}); add {owner}={block}")


def parse_sweep_config(cfg: Any, allowed_extra_keys: Sequence[str] = ()) -> SweepConfig:
    """The one validation pass of the sweep config (a bad value: :class:`ConfigError` naming key, value and what is
    allowed); ``allowed_extra_keys``: top-level keys a caller (the Optuna driver) reads itself."""
    raw = resolve_sweep_config(cfg)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"sweep config = {raw!r} is not allowed: it must be a mapping")
    raw = {key: value for key, value in raw.items() if key not in allowed_extra_keys}
    blocks = settings_blocks()
    unknown = [key for key in raw if key not in SWEEP_KEYS and key not in blocks]
    if unknown:
        raise ConfigError(f"{unknown[0]} is not allowed: unknown sweep key; allowed keys: "
                          f"{', '.join((*SWEEP_KEYS, *blocks))}")
    values: dict[str, Any] = {key: value for key, value in raw.items() if key not in blocks}
    values["launcher"] = raw.get("launcher", DEFAULT_LAUNCHER)
    launcher_class(values["launcher"])  # an unknown name raises, listing the registered ones
    values["backend"] = str(raw.get("backend", DEFAULT_BACKEND))
    backend = get_backend(values["backend"])  # an unknown name raises, listing conf/backend/
    for block, owner in blocks.items():
        if block in raw and block != values[owner]:
            raise ConfigError(foreign_settings_message(block, raw[block], values[owner]))
    values["launcher_settings"] = parse_settings(values["launcher"], raw.get(values["launcher"]))
    if backend.settings is not None:
        values["backend_settings"] = build_params(values["backend"], backend.settings, raw.get(values["backend"]))
    values["seeds"] = _unique([check_seed("seeds", _int_text(item)) for item in _as_list("seeds", raw.get("seeds"))])
    if not values["seeds"]:
        raise ConfigError("seeds = [] is not allowed: give at least one seed, e.g. seeds=1,2")
    values["mechanisms"] = _unique([str(item) for item in _as_list("mechanisms", raw.get("mechanisms"))])
    unknown = [name for name in values["mechanisms"] if name not in available_presets()]
    if unknown:
        raise ConfigError(f"mechanisms = {unknown[0]!r} is not allowed: no conf/dataflex/{unknown[0]}.yaml; "
                          f"presets: {', '.join(available_presets())}")
    for key in ("alpha", "eta"):  # alpha None: the default grid (grid_alphas)
        numbers_given = [_parse_number(key, item) for item in _as_list(key, raw.get(key))]
        values[key] = None if key == "alpha" and raw.get(key) is None else _unique(numbers_given)
    values["extra"] = tuple(str(item) for item in _as_list("extra", raw.get("extra")))
    for key in ("steps", "jobs", "threads", "max_seeds"):
        value = raw.get(key)
        values[key] = None if value is None or value == "" else check_int_at_least(key, _int_text(value), 1)
    if raw.get("target_mde") is not None:
        values["target_mde"] = check_number("target_mde", _parse_number("target_mde", raw["target_mde"]),
                                            minimum=0.0, exclusive=True)
    for key in ("add_baseline", "dry_run", "report", "validate"):
        if key in raw:
            values[key] = parse_switch(key, raw[key])
    for key in ("name", "warm_start"):
        if raw.get(key) is not None:
            values[key] = str(raw[key])
    for key in ("grace_s", "poll_s"):
        if key in raw:
            values[key] = check_number(key, _parse_number(key, raw[key]), minimum=0.0, exclusive=key == "poll_s")
    config = SweepConfig(**values)
    check_sweep(config, backend)
    return config


def check_sweep(config: SweepConfig, backend: Any) -> None:
    """The rules across keys: the name, the experiment, the warm-start design, the seed plan, the metric, and what
    the backend refuses (its ``check`` and its ``check_extra`` of each override, through :func:`read_extra`)."""
    if config.name is not None:
        check_sweep_name(config.name)
    if config.experiment is not None:
        check_choice("experiment", config.experiment, available_experiments())
    check_choice("warm_start", config.warm_start, WARM_START_DESIGNS)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", config.train_module):
        raise ConfigError(f"train_module = {config.train_module!r} is not allowed: it must be a dotted module name run "
                          f"as `python -m <train_module>`")
    backend.check(config)
    common, axes = common_overrides(config), extra_axes(config)
    if config.warm_start == "per_seed":
        given = [str(item) for item in common if item.key == WARM_START_SEED_KEY]
        given += [f"{axis.key}={','.join(map(str, axis.values))}" for axis in axes if axis.name == WARM_START_SEED_KEY]
        if given:
            raise ConfigError(f"extra = {given[0]!r} is not allowed with warm_start=per_seed: each seed's runs start "
                              f"from the warm start of {WARM_START_SEED_KEY} = the run's seed; give warm_start=shared "
                              f"to start every run from the warm start of one {WARM_START_SEED_KEY}")
    if config.target_mde is None and config.max_seeds is not None:
        raise ConfigError(f"max_seeds = {config.max_seeds!r} is not allowed without target_mde: max_seeds caps the "
                          f"seeds a plan adds, and only target_mde makes a plan; give target_mde=<difference to "
                          f"detect> too (make sweep TARGET_MDE=0.01 MAX_SEEDS={config.max_seeds}), or leave "
                          f"max_seeds out")
    if config.target_mde is not None:
        check_int_at_least("max_seeds", plan_cap(config), 2)
        if len(config.seeds) < 2:
            raise ConfigError(f"seeds = {list(config.seeds)} is not allowed with target_mde: the pilot needs at least "
                              f"2 seeds (3 or more give a steadier plan), e.g. seeds=1,2,3")
        if plan_cap(config) < len(config.seeds):
            raise ConfigError(f"max_seeds = {plan_cap(config)} is not allowed: it must be >= the {len(config.seeds)} "
                              f"pilot seeds")
    backend.check_metric("plan_metric", config.plan_metric)
    run_steps(config)  # a backend's default steps may refuse the settings


def resolve_sweep_config(cfg: Any) -> Any:
    """The config as plain containers; an unresolvable interpolation is a ConfigError."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return to_plain(cfg)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "sweep config"
        value = OmegaConf.to_container(cfg, resolve=False)  # the value as written: walk the key's path to it
        for part in re.findall(r"[^.\[\]]+", key):
            try:
                value = value[int(part)] if isinstance(value, list) else value[part]
            except (KeyError, IndexError, ValueError, TypeError):
                value = None
                break
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(f"{key} = {value!r} is not allowed: its interpolation cannot be resolved ({reason}); "
                          f"the sweep driver resolves ${{...}} against its own keys (conf/sweeps/), not a run's "
                          f"config: give the value itself") from None


# A decimal number as text (``1e-400``, ``-0.5``, ``.25``), for the underflow check of command-line values.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_ENV_INTERPOLATION = re.compile(r"\$\{\s*oc\.env\s*:")


def check_no_underflow(where: str, text: str) -> None:
    """Refuse a nonzero number a float reads as 0.0 (``1e-400``: an alpha would become the baseline's)."""
    for token in re.split(r"[\s,\[\](){}:=]+", _QUOTED.sub(" ", text)):
        if _NUMBER.fullmatch(token) and float(token) == 0.0 and re.search(r"[1-9]", token.split("e")[0].split("E")[0]):
            raise ConfigError(f"{where} is not allowed: {token} is not 0 but below the smallest float (about "
                              f"5e-324), so it would be read as 0.0; write 0 for zero, or a number a float holds")


def check_no_env_interpolation(where: str, text: str) -> None:
    """Refuse ``${oc.env:NAME}``: it would write the variable (a secret?) into recorded files."""
    if _ENV_INTERPOLATION.search(text):
        raise ConfigError(f"{where} is not allowed: an ${{oc.env:...}} interpolation would be resolved into the "
                          f"recorded command lines (sweep.json) and run configs, writing the variable's value (a "
                          f"secret?) into files; give the value itself, or let the tool read its variable from "
                          f"the environment (W&B reads WANDB_API_KEY, verl's trackers their own)")
