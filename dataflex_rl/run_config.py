"""A run's config, every backend's: one frozen dataclass per block, the only place a default lives; and the
resolved-config file the sweep driver hands a run (``--config-file``)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dataflex_rl.dataflex_block import DataflexConfig, dataflex_defaults, parse_dataflex_config
from dataflex_rl.keys import WARM_START_DESIGNS
from dataflex_rl.validation import (
    ConfigError,
    build_params,
    check_choice,
    check_int_at_least,
    check_keys,
    check_non_negative_int,
    check_number,
    check_seed,
    check_unit_interval,
    defaults_of,
    to_plain,
)

if TYPE_CHECKING:
    from dataflex_rl.tracking.build import LoggerConfig

ARCHITECTURES = ("qwen2", "llama")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # verl's kl_penalty ("full" needs logits)
# What the trainer can hand an advantage estimator: estimators needing more (values, baselines) are refused.
ESTIMATOR_INPUTS = frozenset({"token_level_rewards", "response_mask", "index", "config", "epsilon",
                              "norm_adv_by_std_in_grpo"})
SAMPLERS = ("cached", "hf")
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _set(params: Any, name: str, value: Any) -> None:
    object.__setattr__(params, name, value)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    path: str | None = None
    architecture: str = "qwen2"  # qwen2 | llama
    hidden_size: int = 128
    # 2 layers: half the compute of 4, and SFT to accuracy 0.5 takes as many problems (docs/results/sft_search_layers.md)
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 64

    def __post_init__(self) -> None:
        if self.path is not None and not (Path(self.path) / "config.json").is_file():
            raise ConfigError(f"path = {self.path!r} is not allowed: it must be a local folder holding a Hugging Face "
                              f"checkpoint (config.json, weights, tokenizer); nothing is downloaded")
        check_choice("architecture", self.architecture, ARCHITECTURES)
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            check_int_at_least(name, getattr(self, name), 1)
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size = {self.hidden_size} is not allowed: it must be a multiple of "
                              f"num_heads = {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_kv_heads = {self.num_kv_heads} is not allowed: it must divide "
                              f"num_heads = {self.num_heads}")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: int = 1000  # the cap of the stopping rule below (without a target: the steps trained)
    batch_size: int = 128
    lr: float = 1e-3
    warmup_steps: int = 20  # the learning rate rises linearly to lr over these steps, then stays
    weight_decay: float = 0.0
    seed: int = 0
    cache_dir: str = ".cache/sft"
    # The stopping rule (docs/analysis.md "Warm starts"): stop at the first check (every ``check_every`` steps,
    # greedy accuracy on ``check_size`` problems outside the RL test pool) at or above ``target_accuracy``; None
    # trains all ``steps``. 0.5 every 10 steps: the default task's warm starts agree
    # (docs/results/sft_search_target.md) where 500 fixed steps land either side of SFT's jump in accuracy. done.json
    # and the runs' meta.json record the stop step, the check accuracy and whether it was reached.
    target_accuracy: float | None = 0.5
    check_every: int = 10
    check_size: int = 256

    def __post_init__(self) -> None:
        check_non_negative_int("steps", self.steps)
        check_int_at_least("batch_size", self.batch_size, 1)
        _set(self, "lr", check_number("lr", self.lr, minimum=0.0, exclusive=True))
        check_int_at_least("warmup_steps", self.warmup_steps, 1)
        _set(self, "weight_decay", check_number("weight_decay", self.weight_decay, minimum=0.0))
        check_non_negative_int("seed", self.seed)
        if self.target_accuracy is not None:
            _set(self, "target_accuracy", check_unit_interval("target_accuracy", self.target_accuracy))
        check_int_at_least("check_every", self.check_every, 1)
        check_int_at_least("check_size", self.check_size, 1)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    total_steps: int = 400
    prompts_per_step: int = 32
    rollouts_per_prompt: int = 8
    temperature: float = 1.0
    max_new_tokens: int | None = None  # None: the task's longest answer plus slack
    recompute_old_log_probs: bool = False  # True: a forward pass, as verl; False: the sampler's own scores
    sampler: str = "cached"  # cached: the project's KV-cached loop (HF generate's samples); hf: HF generate
    pack: bool = True  # forward passes skip padded positions (models the fast decoder covers)
    compile: bool = False  # torch.compile the packed update (cache .cache/torch_compile); README "Timing"
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0  # None: no clipping (actor/grad_norm is logged either way)
    adv_estimator: str = "grpo"  # any of verl's usable here: grpo, rloo, reinforce_plus_plus, ...
    norm_adv_by_std: bool = True
    policy_loss: str = "vanilla"  # verl's policy-loss registry
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    ppo_epochs: int = 1
    ppo_mini_batches: int = 1
    kl_coef: float = 0.0  # > 0 adds verl's KL loss to the SFT reference
    kl_type: str = "low_var_kl"
    val_every: int = 20  # greedy validation every N steps (and at the start and the end)
    # 1024 greedy items every 20 steps: binomial SE ~0.014 at p = 0.7, ~6% of wall time (benchmarks/bench_local.py).
    val_size: int = 1024
    val_seed: int = 0
    save_every: int = 50  # checkpoint every N steps (and at the end); 0: never

    def __post_init__(self) -> None:
        for name in ("total_steps", "val_every", "val_seed", "save_every"):
            check_non_negative_int(name, getattr(self, name))
        for name in ("prompts_per_step", "ppo_epochs", "ppo_mini_batches", "val_size"):
            check_int_at_least(name, getattr(self, name), 1)
        check_int_at_least("rollouts_per_prompt", self.rollouts_per_prompt, 2 if self.adv_estimator in (
            "grpo", "rloo") else 1)
        if self.max_new_tokens is not None:
            check_int_at_least("max_new_tokens", self.max_new_tokens, 1)
        for name, minimum, exclusive in (("temperature", 0.0, True), ("lr", 0.0, True), ("weight_decay", 0.0, False),
                                         ("clip_ratio_low", 0.0, False), ("clip_ratio_high", 0.0, False),
                                         ("clip_ratio_c", 1.0, True), ("kl_coef", 0.0, False)):
            _set(self, name, check_number(name, getattr(self, name), minimum=minimum, exclusive=exclusive))
        if self.grad_clip is not None:
            _set(self, "grad_clip", check_number("grad_clip", self.grad_clip, minimum=0.0, exclusive=True))
        _check_verl_name("adv_estimator", self.adv_estimator, "adv")
        _check_verl_name("policy_loss", self.policy_loss, "policy_loss")
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        if self.ppo_mini_batches > self.prompts_per_step:
            raise ConfigError(f"ppo_mini_batches = {self.ppo_mini_batches} is not allowed: it must be <= "
                              f"prompts_per_step = {self.prompts_per_step} (mini-batches split whole prompt groups)")
        check_choice("kl_type", self.kl_type, KL_TYPES)
        check_choice("sampler", self.sampler, SAMPLERS)
        for name in ("norm_adv_by_std", "recompute_old_log_probs", "pack", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} = {getattr(self, name)!r} is not allowed: it must be true or false")

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def evaluations(self) -> int:
        """Validations in a run: step 0, every ``val_every`` steps, and the last step."""
        every = self.val_every
        return len({0, self.total_steps, *(range(every, self.total_steps + 1, every) if every > 0 else ())})


@dataclasses.dataclass(frozen=True)
class StatsConfig:
    bucket_edges: tuple[float, ...] = (0.25, 0.5, 0.75)
    exact_every: int = 50  # 0: never; the exact per-bucket parameter-gradient norms cost one backward per bucket
    exact_samples: int = 64  # sequences in the subsample for the exact norms
    # 0: never; each measurement costs one forward pass of the batch
    prob_change_every: int = 10

    def __post_init__(self) -> None:
        edges = tuple(self.bucket_edges)
        if not edges or any(isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 < e < 1 for e in edges) \
                or list(edges) != sorted(set(edges)):
            raise ConfigError(f"bucket_edges = {list(edges)!r} is not allowed: it must be a non-empty increasing "
                              f"list of distinct numbers strictly between 0 and 1")
        _set(self, "bucket_edges", tuple(float(e) for e in edges))
        check_non_negative_int("exact_every", self.exact_every)
        check_int_at_least("exact_samples", self.exact_samples, 1)
        check_non_negative_int("prob_change_every", self.prob_change_every)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    name: str
    params: Mapping[str, Any]
    # The task instance validation built (kept so the trainer does not build it again; not part of equality).
    built: Any = dataclasses.field(default=None, compare=False, repr=False)


MODES = ("train", "sft")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_dir: str  # the run store; the same run_dir again resumes the run
    dataflex: DataflexConfig
    model: ModelConfig
    task: TaskConfig
    sft: SFTConfig
    trainer: TrainerConfig
    stats: StatsConfig
    logger: LoggerConfig
    seed: int = 1  # RL seed (sampling, problem draws); the SFT warm start has its own sft.seed
    experiment: str | None = None  # the named experiment the run was composed with (set by its file)
    sweep: str | None = None  # sweep name (W&B group); set by the sweep driver
    run_name: str | None = None  # None: the run_dir's folder name
    mechanism_label: str | None = None  # free label for analysis (baseline, ar, lopti, ...)
    axes: tuple[str, ...] = ()  # the config keys a sweep varies (set by the sweep driver; meta.json records them)
    warm_start: str | None = None  # the sweep's warm-start design, per_seed | shared; None outside a sweep
    threads: int | None = 1  # torch threads (1: measured faster than 2 here, README "Timing"); None: torch's default
    mode: str = "train"  # train | sft (build the cached SFT warm start only, then exit)

    def __post_init__(self) -> None:
        _set(self, "seed", check_seed("seed", self.seed))
        check_choice("mode", self.mode, MODES)
        if self.threads is not None:
            check_int_at_least("threads", self.threads, 1)
        if self.warm_start is not None:
            check_choice("warm_start", self.warm_start, WARM_START_DESIGNS)
        axes = () if self.axes is None else self.axes
        if not isinstance(axes, (list, tuple)) or not all(isinstance(key, str) and key for key in axes):
            raise ConfigError(f"axes = {axes!r} is not allowed: it must be a list of dotted config keys "
                              f"(the sweep driver sets it)")
        _set(self, "axes", tuple(axes))


SECTIONS = ("dataflex", "model", "task", "sft", "trainer", "stats", "logger")
TOP_LEVEL_KEYS = (*(field.name for field in dataclasses.fields(TrainConfig)), "hydra")


def parse_train_config(cfg: Any) -> TrainConfig:
    raw = to_plain(cfg)
    check_keys("config", raw, TOP_LEVEL_KEYS)
    if not raw.get("run_dir"):
        raise ConfigError("run_dir = None is not allowed: give run_dir=PATH (where the run store goes)")
    task = dict(raw.get("task") or {})
    if "name" not in task:
        raise ConfigError(f"task = {task!r} is not allowed: it needs a 'name' (task=arithmetic|knights_knaves)")
    task_name = task.pop("name")
    from dataflex_rl.tracking import parse_logger_config

    try:  # validated once here; build_loggers takes the result as it is
        logger = parse_logger_config(raw.get("logger"))  # None (no logger block): the defaults
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from None
    given = {key: raw[key] for key in TOP_LEVEL_KEYS if key in raw and key not in (*SECTIONS, "run_dir", "hydra")}
    return TrainConfig(
        run_dir=str(raw["run_dir"]),
        dataflex=parse_dataflex_config(raw.get("dataflex") or {}),
        model=build_params("model", ModelConfig, raw.get("model")),
        task=TaskConfig(name=task_name, params=task, built=_check_task(task_name, task)),
        sft=build_params("sft", SFTConfig, raw.get("sft")),
        trainer=build_params("trainer", TrainerConfig, raw.get("trainer")),
        stats=build_params("stats", StatsConfig, raw.get("stats")),
        logger=logger,
        **given,
    )


def _check_task(name: str, params: dict[str, Any]) -> Any:
    from dataflex_rl.registry import RegistryError
    from dataflex_rl.tasks import build_task

    try:
        return build_task(name, params)
    except RegistryError as error:
        raise ConfigError(f"task.name = {name!r} is not allowed: {error}") from None
    except (ValueError, TypeError) as error:
        raise ConfigError(f"task.{error}") from None


def _check_verl_name(key: str, value: str, kind: str) -> None:
    import inspect

    from verl.trainer.ppo import core_algos

    if kind == "adv":
        usable = sorted(name for name, function in core_algos.ADV_ESTIMATOR_REGISTRY.items()
                        if {name for name, parameter in inspect.signature(function).parameters.items()
                            if parameter.default is inspect.Parameter.empty and parameter.kind not in (
                                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)} <= ESTIMATOR_INPUTS)
    else:  # verl's own losses: a plugin's (the dataflex route of backend=verl) is not for the local trainer, which
        # applies the dataflex block itself, and its runs leave verl's plugins unloaded (sweeps/backends/local.py)
        usable = sorted(name for name, function in core_algos.POLICY_LOSS_REGISTRY.items()
                        if function.__module__.startswith("verl."))
    if value not in usable:
        raise ConfigError(f"{key} = {value!r} is not allowed; allowed values (verl's, usable here): "
                          f"{', '.join(usable)}")


@functools.cache
def store_defaults() -> dict[str, list[str]]:
    from hydra.core.config_store import ConfigStore

    from dataflex_rl.tasks import TASKS
    from dataflex_rl.tracking.build import DEFAULT_LOGGERS, LoggerConfig, in_tree_loggers, logger_class

    store = ConfigStore.instance()
    store.store(name="train_defaults", node={
        **defaults_of(TrainConfig), "dataflex": dataflex_defaults(), "sft": defaults_of(SFTConfig),
        "stats": defaults_of(StatsConfig)})
    store.store(group="model", name="tiny", node=defaults_of(ModelConfig))
    store.store(group="trainer", name="grpo", node=defaults_of(TrainerConfig))
    tasks = [name for name in TASKS.names() if TASKS.get(name).__module__.startswith("dataflex_rl.tasks.")]
    for name in tasks:
        store.store(group="task", name=name, node={"name": name, **defaults_of(TASKS.get(name).config_class)})
    common = {key: value for key, value in defaults_of(LoggerConfig).items() if key != "loggers"}
    store.store(group="logger", name="default", node={
        "defaults": [*({name: "default"} for name in DEFAULT_LOGGERS), "_self_"], **common})
    for name in in_tree_loggers():
        store.store(group=f"logger/{name}", name="default", node=defaults_of(logger_class(name).Config))
    return {"model": ["tiny"], "trainer": ["grpo"], "task": sorted(tasks), "logger": ["default"]}


# The sweep driver writes each run's resolved config to a file the run reads back (``--config-file PATH``).
CONFIG_FILE_FLAG = "--config-file"


def write_config_file(path: Path, resolved: Mapping[str, Any], comment: Sequence[str] = ()) -> None:
    """Write a resolved config for ``--config-file`` (atomically)."""
    from dataflex_rl.tracking.run_store import atomic_write_bytes
    from dataflex_rl.validation import to_plain

    header = "".join("# " + line.replace("\r", "\\r").replace("\n", "\\n") + "\n" for line in comment)
    text = yaml.safe_dump(to_plain(resolved), sort_keys=False, default_flow_style=False, allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (header + text).encode("utf-8"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The resolved config in ``path`` (:func:`write_config_file`)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read: {error.strerror or error}") from None
    try:
        config = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} holds a {type(config).__name__}, expected a resolved conf/train.yaml")
    return config


@contextlib.contextmanager
def environment_set(variables: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def quiet_verl_import() -> Iterator[None]:
    """verl imported without its optional-engine warnings and INFO logs (validation reads its registries)."""
    level = {"VERL_LOGGING_LEVEL": os.environ.get("VERL_LOGGING_LEVEL") or "ERROR"}
    with environment_set(level), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
