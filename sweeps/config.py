"""The sweep driver's configuration (``conf/sweeps/default.yaml``), typed once at the entry point.

``python -m sweeps key=value ...`` composes ``conf/sweeps/default.yaml`` with Hydra's compose API (no Hydra run
folder, no log files) and turns it into a frozen :class:`SweepConfig`. Every value is checked here or by the run
configs' own validation (:mod:`sweeps.commands`) before anything starts; a bad one raises
:class:`~dataflex_rl.validation.ConfigError` naming the key, the value and what is allowed.

Command-line conveniences (so that ``make sweep ALPHA=0.0,0.25,0.5`` works): ``alpha=0.0,0.25,0.5`` is read as
the list ``alpha=[0.0,0.25,0.5]`` (the same for ``seeds``, ``mechanisms`` and ``eta``), and ``extra=[a=1 b=2]``
(space-separated overrides, as ``make sweep EXTRA="a=1 b=2"`` writes it) is read as the list ``['a=1', 'b=2']``.

Launchers: ``launcher=<name>`` picks the Hydra config ``conf/sweeps/launcher/<name>.yaml`` (a config group in
``default.yaml``'s defaults list); the names allowed are those registered in :data:`sweeps.launchers.LAUNCHERS`.
The chosen launcher's ``<name>:`` block (``slurm.partition=gpu``) becomes :attr:`SweepConfig.launcher_settings`,
typed by the launcher's own settings class; another launcher's block is refused, since it would have no effect.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.keys import (
    ALPHA_KEY,
    BASELINE_ALPHA,
    BASELINE_PRESET,
    WARM_START_DESIGNS,
    WARM_START_SEED_KEY,
    check_metric_key,
)
from dataflex_rl.local.cli import EXPERIMENT_GROUP, check_group_choice, run_experiments
from dataflex_rl.overrides import Override, hydra_value, parse_override
from dataflex_rl.validation import (
    SEED_MODULUS,
    ConfigError,
    check_choice,
    check_int_at_least,
    check_number,
    check_seed,
    to_plain,
)
from sweeps.launchers import LAUNCHERS as LAUNCHER_REGISTRY
from sweeps.launchers import launcher_class, parse_settings

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
SWEEP_CONF_DIR = CONF_DIR / "sweeps"
PRESET_DIR = CONF_DIR / "dataflex"
BACKENDS = ("local", "verl")
# The run config key that sets a run's RL steps, per backend (``steps=N`` writes it).
STEPS_KEYS = {"local": "trainer.total_steps", "verl": "trainer.total_training_steps"}
DEFAULT_LAUNCHER = "process"  # conf/sweeps/default.yaml's defaults list
LIST_KEYS = ("alpha", "seeds", "mechanisms", "eta")
DEFAULT_ALPHA = (0.0, 0.5)
# The default sweep: 2 alphas x 8 seeds (a warm start each) x 120 RL steps takes about 11 minutes on 2 cores after
# .venv, and its report states what it can detect (docs/results/default.md: the MDE of the final val/accuracy).
DEFAULT_SEEDS = tuple(range(1, 9))
DEFAULT_LOCAL_STEPS = 120
# A seed plan (target_mde) never runs more seeds than this unless max_seeds says otherwise.
DEFAULT_MAX_SEEDS = 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# A sweep name is a folder name and W&B's run group: at most this many characters (folders allow 255 bytes, and the
# sweep's run folders and lock files live inside it).
MAX_NAME_LENGTH = 128
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0", "")


# Threads of a lone run (one run live; the SFT warm start). Measured by benchmarks/bench_local.py ("1 -> 2
# threads" row): a default step at 2 threads took 4-27x as long as at 1 on the shared 2-core development machine
# (the model's matmuls are too small to split); rerun it on a quiet machine with cores to spare before raising
# this. threads=N overrides it.
SINGLE_RUN_THREADS = 1


def check_sweep_name(name: str, key: str = "name") -> str:
    """``name`` if it is a sweep name: a folder name of letters, digits, '.', '_' and '-', starting with a letter or
    digit, at most :data:`MAX_NAME_LENGTH` characters; :class:`ConfigError` naming ``key`` otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{key} = {name!r} is not allowed: a sweep name is a folder name of letters, digits, '.', "
                          f"'_' and '-', starting with a letter or digit")
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(f"{key} = {name[:20]!r}... ({len(name)} characters) is not allowed: a sweep name has at "
                          f"most {MAX_NAME_LENGTH} characters")
    return name


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask, which containers and ``taskset`` shrink)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_presets() -> list[str]:
    """Names of the dataflex presets, ``conf/dataflex/<name>.yaml``."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def available_experiments() -> list[str]:
    """Names of the named experiments: a run setting ``conf/experiment/<name>.yaml`` with its sweep
    ``conf/sweeps/experiment/<name>.yaml`` (both, or it is not one)."""
    sweeps = {path.stem for path in (SWEEP_CONF_DIR / EXPERIMENT_GROUP).glob("*.yaml")}
    return [name for name in run_experiments() if name in sweeps]


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
    "warm_start": "use the sweep key warm_start=per_seed|shared (the driver records it in each run)",
    ALPHA_KEY: "use alpha=0.0,0.5",
}


@dataclasses.dataclass(frozen=True)
class Axis:
    """One factor of a sweep's grid, typed once: ``name`` (the factor's name in run names, records and tables:
    ``mechanism_label``, ``alpha``, ``eta``, ``seed`` or the config key), the config ``key`` (or group) a run's
    override sets, the ``values`` (numbers for alpha, eta and seeds, preset names, an extra axis's values in Hydra's
    grammar) and the override's ``prefix`` (``++`` for an actuator parameter the preset may lack)."""

    name: str
    key: str
    values: tuple[Any, ...]
    prefix: str = ""

    def override(self, value: Any) -> Override:
        """The override that gives a run this axis's ``value``."""
        text = value if isinstance(value, str) else hydra_value(value)
        return Override(self.key, text, self.prefix, text=f"{self.prefix}{self.key}={text}")


def parse_extra(extra: Sequence[str], train_groups: bool = True) -> tuple[tuple[Override, ...], tuple[Axis, ...]]:
    """Split ``extra`` into (common overrides, axes), each read once by Hydra's grammar; overrides of the keys the
    driver manages, and sweeps that list no values, are refused naming the override. ``train_groups``: the overrides
    are ``conf/train.yaml``'s (the local backend), so a config-group choice must name a file of its group (a verl
    experiment's keys, such as ``model=``, are not these groups)."""
    common: list[Override] = []
    axes: list[Axis] = []
    for item in extra:
        check_no_env_interpolation(f"extra = {item!r}", item)
        check_no_underflow(f"extra = {item!r}", item)
        override = parse_override(item, where=f"extra = {item!r}")
        if train_groups:
            check_group_choice(override)
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
    """One sweep: the grid (``alpha`` x ``seeds`` x ``mechanisms`` x ``eta`` x extra axes) and how to run it."""

    name: str | None = None
    root: str = "runs"
    experiment: str | None = None  # a named experiment: its runs are composed with experiment=<name>
    alpha: tuple[float, ...] | None = None  # None: DEFAULT_ALPHA, or with mechanisms each preset's own alpha (())
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    add_baseline: bool = True
    mechanisms: tuple[str, ...] = ()
    eta: tuple[float, ...] = ()
    extra: tuple[str, ...] = ()
    steps: int | None = None
    local_steps: int | None = DEFAULT_LOCAL_STEPS
    target_mde: float | None = None
    max_seeds: int | None = None  # with target_mde: DEFAULT_MAX_SEEDS when None; without it, must stay None
    plan_metric: str = "val/accuracy"
    backend: str = "local"
    launcher: str = DEFAULT_LAUNCHER
    jobs: int | None = None
    threads: int | None = None
    dry_run: bool = False
    report: bool = True
    sft_warm_start: bool = True
    warm_start: str = "per_seed"
    validate: bool = True
    train_module: str = "dataflex_rl.train"
    verl_experiment: str = "verl_kk_3b"
    grace_s: float = 30.0
    poll_s: float = 0.25
    launcher_settings: Any = None  # the launcher's typed ``<launcher>:`` block (sweeps/launchers/), None if it has none
    # ``extra`` read once (:func:`parse_extra`): the overrides every run shares, and the extra axes of the grid.
    common: tuple[Override, ...] = dataclasses.field(init=False, default=())
    extra_axes: tuple[Axis, ...] = dataclasses.field(init=False, default=())

    def __post_init__(self) -> None:
        if self.name is not None:
            check_sweep_name(self.name)
        if self.experiment is not None:
            check_choice("experiment", self.experiment, available_experiments())
            if self.backend != "local":
                raise ConfigError(f"experiment = {self.experiment!r} is not allowed with backend={self.backend}: a "
                                  f"named experiment is a local-backend setting; verl runs take verl_experiment=")
        self._resolve_defaults()
        check_choice("backend", self.backend, BACKENDS)
        check_choice("warm_start", self.warm_start, WARM_START_DESIGNS)
        self._check_warm_start_seed()
        self._check_launcher()
        if not self.seeds:
            raise ConfigError("seeds = [] is not allowed: give at least one seed, e.g. seeds=1,2")
        if self.steps is not None:
            check_int_at_least("steps", self.steps, 1)
        if self.local_steps is not None:
            check_int_at_least("local_steps", self.local_steps, 1)
        if self.target_mde is None and self.max_seeds is not None:
            raise ConfigError(f"max_seeds = {self.max_seeds!r} is not allowed without target_mde: max_seeds caps the "
                              f"seeds a plan adds, and only target_mde makes a plan; give target_mde=<difference to "
                              f"detect> too (make sweep TARGET_MDE=0.01 MAX_SEEDS={self.max_seeds}), or leave "
                              f"max_seeds out")
        if self.target_mde is not None:
            check_int_at_least("max_seeds", self.max_seeds, 2)
            check_number("target_mde", self.target_mde, minimum=0.0, exclusive=True)
            if len(self.seeds) < 2:
                raise ConfigError(f"seeds = {list(self.seeds)} is not allowed with target_mde: the pilot needs at "
                                  f"least 2 seeds (3 or more give a steadier plan), e.g. seeds=1,2,3")
            if self.max_seeds < len(self.seeds):
                raise ConfigError(f"max_seeds = {self.max_seeds} is not allowed: it must be >= the {len(self.seeds)} "
                                  f"pilot seeds")
        if self.jobs is not None:
            check_int_at_least("jobs", self.jobs, 1)
        if self.threads is not None:
            check_int_at_least("threads", self.threads, 1)
        if self.backend == "local":  # verl runs log verl's own keys besides these
            check_metric_key("plan_metric", self.plan_metric)
        check_number("grace_s", self.grace_s, minimum=0.0)
        check_number("poll_s", self.poll_s, minimum=0.0, exclusive=True)
        if not re.fullmatch(r"[A-Za-z_][\w.]*", self.train_module):
            raise ConfigError(f"train_module = {self.train_module!r} is not allowed: it must be a dotted module "
                              f"name run as `python -m <train_module>`")
        unknown = [name for name in self.mechanisms if name not in available_presets()]
        if unknown:
            raise ConfigError(f"mechanisms = {unknown[0]!r} is not allowed: no conf/dataflex/{unknown[0]}.yaml; "
                              f"presets: {', '.join(available_presets())}")

    def _resolve_defaults(self) -> None:
        """The defaults that depend on other keys (the one place these rules live; idempotent).

        - ``alpha`` unset: :data:`DEFAULT_ALPHA`, or with mechanism presets each preset's own alpha (GRPO, +AR,
          +Lopti, +AR+Lopti as the paper's tables have them, not every preset crossed with every alpha);
        - the ``baseline`` preset joins a mechanism axis (the unweighted GRPO run is always compared);
        - a named ``experiment`` is the first common override of every run (``experiment=<name>``);
        - ``steps`` unset on the local backend: ``local_steps``, unless ``extra`` sets ``trainer.total_steps`` (the
          trainer's own 400 steps make a sweep too long for a laptop);
        - ``max_seeds`` unset with a ``target_mde``: :data:`DEFAULT_MAX_SEEDS`.
        """
        if self.target_mde is not None and self.max_seeds is None:
            object.__setattr__(self, "max_seeds", DEFAULT_MAX_SEEDS)
        if self.experiment is not None and f"experiment={self.experiment}" not in self.extra:
            object.__setattr__(self, "extra", (f"experiment={self.experiment}", *self.extra))
        if self.alpha is None:
            object.__setattr__(self, "alpha", () if self.mechanisms else DEFAULT_ALPHA)
        if self.mechanisms and self.add_baseline and BASELINE_PRESET not in self.mechanisms \
                and BASELINE_PRESET in available_presets():
            object.__setattr__(self, "mechanisms", (BASELINE_PRESET, *self.mechanisms))
        common, axes = parse_extra(self.extra, train_groups=self.backend == "local")
        object.__setattr__(self, "common", common)
        object.__setattr__(self, "extra_axes", axes)
        if self.steps is None and self.backend == "local" and not self.common_sets(STEPS_KEYS["local"]):
            object.__setattr__(self, "steps", self.local_steps)

    def _check_warm_start_seed(self) -> None:
        """``warm_start=per_seed`` sets each run's ``sft.seed`` from its seed: an ``extra`` that sets it too is
        refused, naming the way to fix one warm start."""
        if self.warm_start != "per_seed":
            return
        given = [str(item) for item in self.common if item.key == WARM_START_SEED_KEY]
        given += [f"{axis.key}={','.join(map(str, axis.values))}" for axis in self.extra_axes
                  if axis.name == WARM_START_SEED_KEY]
        if given:
            raise ConfigError(f"extra = {given[0]!r} is not allowed with warm_start=per_seed: each seed's runs start "
                              f"from the warm start of {WARM_START_SEED_KEY} = the run's seed; give "
                              f"warm_start=shared to start every run from the warm start of one {WARM_START_SEED_KEY}")

    def _check_launcher(self) -> None:
        """The launcher must be registered; its settings default to the launcher's own."""
        settings_type = launcher_class(self.launcher).settings
        if settings_type is None:
            if self.launcher_settings is not None:
                raise ConfigError(f"launcher = {self.launcher!r} takes no settings, got {self.launcher_settings!r}")
        elif self.launcher_settings is None:
            object.__setattr__(self, "launcher_settings", settings_type())
        elif not isinstance(self.launcher_settings, settings_type):
            raise ConfigError(f"{self.launcher} = {self.launcher_settings!r} is not allowed: it must be a "
                              f"{settings_type.__name__}")

    def common_sets(self, key: str) -> bool:
        """Whether a common ``extra`` override sets config ``key``."""
        return any(item.key == key for item in self.common)

    @property
    def alphas(self) -> tuple[float, ...]:
        """The alpha axis with the alpha = 0 baseline first when ``add_baseline`` and it is missing."""
        if self.alpha and self.add_baseline and BASELINE_ALPHA not in self.alpha:
            return (BASELINE_ALPHA, *self.alpha)
        return self.alpha


# --- parsing -----------------------------------------------------------------------------------------------------
def _as_list(key: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, Mapping):
        raise ConfigError(f"{key} = {value!r} is not allowed: give a value or a list, e.g. {key}=1,2")
    return [value]


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if value is not None else ""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{key} = {value!r} is not allowed: it must be true or false")


def _parse_number(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a finite number")
    return float(value)


def _unique(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


def _parse_alpha(value: Any) -> tuple[float, ...]:
    return _unique([_parse_number("alpha", item) for item in _as_list("alpha", value)])


def _parse_seeds(value: Any) -> tuple[int, ...]:
    """The seed axis: each an allowed run seed (:func:`check_seed`), and no two giving the same runs."""
    seeds = []
    for item in _as_list("seeds", value):
        if isinstance(item, str) and item.strip().isdigit():
            item = int(item)
        seeds.append(check_seed("seeds", item))
    by_stream: dict[int, int] = {}
    for seed in _unique(seeds):  # unreachable with check_seed's range; kept as the sweep's own rule
        other = by_stream.setdefault(seed % SEED_MODULUS, seed)
        if other != seed:
            raise ConfigError(f"seeds = {seed} is not allowed together with seed {other}: both give the same runs "
                              f"(per-step seeds are taken mod {SEED_MODULUS})")
    return _unique(seeds)


def _optional_int(key: str, value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return check_int_at_least(key, value, 1)


SWEEP_KEYS = tuple(field.name for field in dataclasses.fields(SweepConfig) if field.name != "launcher_settings")


def settings_blocks() -> tuple[str, ...]:
    """Config keys that hold a launcher's settings (``slurm``, ``ray``): the names of launchers that have some."""
    return tuple(name for name in LAUNCHER_REGISTRY.names() if LAUNCHER_REGISTRY.get(name).settings is not None)


def _launcher_values(raw: Mapping[str, Any]) -> tuple[str, Any]:
    """(the launcher's registered name, its typed settings) from a raw sweep config; a settings block of another
    launcher is refused (it would have no effect)."""
    name = raw.get("launcher", DEFAULT_LAUNCHER)
    launcher_class(name)  # an unknown name raises, listing the registered ones
    for block in settings_blocks():
        if block in raw and block != name:
            raise ConfigError(foreign_settings_message(block, raw[block], name))
    return name, parse_settings(name, raw.get(name)) if name in settings_blocks() else None


def foreign_settings_message(key: str, value: Any, launcher: str) -> str:
    """The error for ``<block>.<key>=...`` given with another launcher (``slurm.partition=x`` with process)."""
    block = key.split(".", 1)[0]
    return (f"{key} = {value!r} is not allowed with launcher={launcher}: {block}.* are the settings of "
            f"launcher={block} (conf/sweeps/launcher/{block}.yaml); add launcher={block}")


def parse_sweep_config(cfg: Any, allowed_extra_keys: Sequence[str] = ()) -> SweepConfig:
    """Validate a composed sweep config (``DictConfig`` or dict) into a :class:`SweepConfig`.

    ``allowed_extra_keys``: top-level keys that a caller (the Optuna driver) reads itself and that are ignored here.
    """
    raw = resolve_sweep_config(cfg)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"sweep config = {raw!r} is not allowed: it must be a mapping")
    raw = {key: value for key, value in raw.items() if key not in allowed_extra_keys}
    unknown = [key for key in raw if key not in SWEEP_KEYS and key not in settings_blocks()]
    if unknown:
        raise ConfigError(f"{unknown[0]} is not allowed: unknown sweep key; allowed keys: "
                          f"{', '.join((*SWEEP_KEYS, *settings_blocks()))}")
    values: dict[str, Any] = {key: value for key, value in raw.items() if key not in settings_blocks()}
    values["launcher"], values["launcher_settings"] = _launcher_values(raw)
    values["seeds"] = _parse_seeds(raw.get("seeds"))
    values["mechanisms"] = _unique([str(item) for item in _as_list("mechanisms", raw.get("mechanisms"))])
    alpha = raw.get("alpha")
    values["alpha"] = _parse_alpha(alpha) if alpha is not None else None
    values["eta"] = _unique([_parse_number("eta", item) for item in _as_list("eta", raw.get("eta"))])
    values["extra"] = tuple(str(item) for item in _as_list("extra", raw.get("extra")))
    for key in ("steps", "local_steps", "jobs", "threads"):
        values[key] = _optional_int(key, raw.get(key))
    if raw.get("target_mde") is not None:
        values["target_mde"] = _parse_number("target_mde", raw["target_mde"])
    if raw.get("max_seeds") is not None:
        values["max_seeds"] = _optional_int("max_seeds", raw["max_seeds"])
    for key in ("add_baseline", "dry_run", "report", "sft_warm_start", "validate"):
        if key in raw:
            values[key] = _parse_bool(key, raw[key])
    if raw.get("name") is not None:
        values["name"] = str(raw["name"])
    if raw.get("warm_start") is not None:
        values["warm_start"] = str(raw["warm_start"])
    return SweepConfig(**values)


def resolve_sweep_config(cfg: Any) -> Any:
    """The composed sweep config as plain containers, interpolations resolved; an interpolation that does not
    resolve (``${trainer.total_steps}`` names no sweep key, ``${oc.decode:...}`` of a bad value) is a
    :class:`ConfigError` naming the key, its value as given and OmegaConf's reason."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return to_plain(cfg)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "sweep config"
        value = _unresolved(OmegaConf.to_container(cfg, resolve=False), key)
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(f"{key} = {value!r} is not allowed: its interpolation cannot be resolved ({reason}); "
                          f"the sweep driver resolves ${{...}} against its own keys (conf/sweeps/), not a run's "
                          f"config: give the value itself") from None


def _unresolved(raw: Any, key: str) -> Any:
    """The value at ``key`` (``extra[0]``, ``slurm.partition``) of an unresolved plain config (None when absent)."""
    node = raw
    for part in re.findall(r"[^.\[\]]+", key):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return node


# A decimal number as text (``1e-400``, ``-0.5``, ``.25``), for the underflow check of command-line values.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def check_no_underflow(where: str, text: str) -> None:
    """Refuse a number written in ``text`` (an override's value, outside quotes) that is not zero but that a float
    cannot hold: ``1e-400`` reads as 0.0, which would silently turn, say, an alpha into the baseline's."""
    for token in re.split(r"[\s,\[\](){}:=]+", _QUOTED.sub(" ", text)):
        if _NUMBER.fullmatch(token) and float(token) == 0.0 and re.search(r"[1-9]", token.split("e")[0].split("E")[0]):
            raise ConfigError(f"{where} is not allowed: {token} is not 0 but below the smallest float (about "
                              f"5e-324), so it would be read as 0.0; write 0 for zero, or a number a float holds")


_ENV_INTERPOLATION = re.compile(r"\$\{\s*oc\.env\s*:")


def check_no_env_interpolation(where: str, text: str) -> None:
    """Refuse ``${oc.env:NAME}`` in what becomes a recorded command line or config: it would be resolved into
    ``sweep.json`` and the runs' ``config.yaml``, writing a secret it names into files."""
    if _ENV_INTERPOLATION.search(text):
        raise ConfigError(f"{where} is not allowed: an ${{oc.env:...}} interpolation would be resolved into the "
                          f"recorded command lines (sweep.json) and run configs, writing the variable's value (a "
                          f"secret?) into files; give the value itself, or let the tool read its variable from "
                          f"the environment (W&B reads WANDB_API_KEY, verl's trackers their own)")
