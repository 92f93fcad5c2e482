"""A verl run's config: trainer modes, composing verl's config, and the trainer's build-time checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.dataflex_block import build_mechanism
from dataflex_rl.mechanism import Mechanism
from dataflex_rl.validation import ConfigError, check_keys, check_non_negative_int, to_plain

TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
# The dataflex trainers (registered by dataflex_rl.verl.trainer, one per verl V1 mode) and the verl mode each runs as.
TRAINER_MODES = {"dataflex_sync": "sync", "dataflex_colocate_async": "colocate_async",
                 "dataflex_separate_async": "separate_async"}
DEFAULT_TRAINER_MODE = "dataflex_sync"
SEPARATE_ASYNC = "dataflex_separate_async"  # the mode whose rollout pool needs a checkpoint engine
CHECKPOINT_BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
EXAMPLE_OVERRIDES = ("+dataflex.mechanism=reweight +dataflex.scorer.name=token_prob "
                     "+dataflex.actuator.name=advantage_reweight +dataflex.actuator.params.alpha=0.5")
STATS_BLOCK = "dataflex_stats"
STATS_KEYS = ("prob_change_every",)
BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
OPTIM_PREFIX = "actor_rollout_ref.actor.optim"
# Besides the schedule type, the optimiser keys through which verl 0.9.1 warms the learning rate up.
WARMUP_KEYS = ("lr_warmup_steps", "lr_warmup_steps_ratio")


def check_trainer_mode(mode: Any, where: str = TRAINER_MODE_KEY) -> str:
    if mode not in TRAINER_MODES:
        raise ConfigError(f"{where} = {mode!r} is not allowed: the dataflex trainers are {list(TRAINER_MODES)} "
                          f"(verl's modes {list(TRAINER_MODES.values())} with the mechanism)")
    return mode


def compose_verl_config(overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=list(overrides))
        OmegaConf.resolve(config)
    except Exception as error:  # Hydra's and OmegaConf's errors name the bad override
        raise ConfigError(f"verl config does not compose: {type(error).__name__}: {error}") from None
    return config


def validate_overrides(overrides: Sequence[str], environment: Mapping[str, str] | None = None) -> tuple[Any, Any, Any]:
    config = compose_verl_config(overrides)
    return (config, *validate_config(config, environment))


def validate_config(config: Any, environment: Mapping[str, str] | None = None) -> tuple[Mechanism, Any]:
    from omegaconf import OmegaConf

    from dataflex_rl.verl.run_record import run_place

    mode = check_trainer_mode(OmegaConf.select(config, TRAINER_MODE_KEY))
    if (environment or {}).get("VERL_PLATFORM") == "cpu":
        from dataflex_rl.verl.cpu.patches import CPU_CHECKPOINT_ENGINE, ROLLOUT_NAME

        rollout = OmegaConf.select(config, "actor_rollout_ref.rollout.name")
        if rollout != ROLLOUT_NAME:
            raise ConfigError(f"actor_rollout_ref.rollout.name = {rollout!r} is not allowed in verl's CPU mode: "
                              f"it needs {ROLLOUT_NAME} (vLLM, SGLang and TRT-LLM need GPUs)")
        backend = OmegaConf.select(config, CHECKPOINT_BACKEND_KEY)
        if mode == SEPARATE_ASYNC and backend != CPU_CHECKPOINT_ENGINE:
            raise ConfigError(f"{CHECKPOINT_BACKEND_KEY} = {backend!r} is not allowed with {TRAINER_MODE_KEY}="
                              f"{mode} in verl's CPU mode: its rollout pool gets the weights through "
                              f"{CPU_CHECKPOINT_ENGINE} (verl's engines need GPUs or RDMA)")
    mechanism = mechanism_from_verl_config(config)
    prob_change_every(config)
    return mechanism, run_place(config, mechanism.config.mechanism)


def mechanism_from_verl_config(config: Mapping[str, Any]) -> Mechanism:
    block = config.get("dataflex") if isinstance(config, Mapping) else None
    if block is None:
        v1 = ((config.get("trainer") or {}).get("v1") or {}) if isinstance(config, Mapping) else {}
        raise ConfigError(f"dataflex: missing; {TRAINER_MODE_KEY}={v1.get('trainer_mode', DEFAULT_TRAINER_MODE)} "
                          f"needs a dataflex block on the verl command line, e.g. {EXAMPLE_OVERRIDES}")
    mechanism = build_mechanism(to_plain(block))
    check_fields_available(config, mechanism)
    if mechanism.staged:
        check_constant_schedule(config, mechanism)
        check_no_distillation(config, mechanism)
    return mechanism


def prob_change_every(config: Mapping[str, Any]) -> int:
    block = to_plain(config.get(STATS_BLOCK)) if isinstance(config, Mapping) else None
    if block is None:
        return 0
    if not isinstance(block, Mapping):
        raise ConfigError(f"{STATS_BLOCK} = {block!r} is not allowed: it must be a mapping with keys {STATS_KEYS}")
    check_keys(STATS_BLOCK, block, STATS_KEYS)
    return check_non_negative_int(f"{STATS_BLOCK}.prob_change_every", block.get("prob_change_every", 0))


def check_fields_available(config: Mapping[str, Any], mechanism: Mechanism) -> None:
    if "entropy" not in mechanism.required_fields:
        return
    correction = (config.get("algorithm") or {}).get("rollout_correction") or {}
    if correction.get("bypass_mode", False):
        raise ConfigError(
            f"{BYPASS_KEY} = True is not allowed with dataflex.scorer.name = {mechanism.config.scorer.name!r}: "
            f"under bypass mode verl computes no old-policy entropy; set {BYPASS_KEY}=False or use a scorer that "
            f"reads old_log_probs only (token_prob)"
        )


def check_constant_schedule(config: Mapping[str, Any], mechanism: Mechanism) -> None:
    optim = to_plain(config).get("actor_rollout_ref", {}).get("actor", {}).get("optim", {}) or {}
    moving = []
    # warmup_style (FSDP's old name) overrides lr_scheduler_type when set; lr_decay_style is Megatron's.
    if optim.get("warmup_style") is not None:
        if optim["warmup_style"] != "constant":
            moving.append(("warmup_style", optim["warmup_style"]))
    elif optim.get("lr_scheduler_type", "constant") not in ("constant", None):
        moving.append(("lr_scheduler_type", optim["lr_scheduler_type"]))
    if optim.get("lr_decay_style", "constant") not in ("constant", None):
        moving.append(("lr_decay_style", optim["lr_decay_style"]))
    moving += [(key, optim[key]) for key in WARMUP_KEYS if (optim.get(key) or 0) > 0]
    if moving:
        key, value = moving[0]
        alias = " (verl's deprecated name of lr_scheduler_type, which it overrides)" if key == "warmup_style" else ""
        raise ConfigError(
            f"{OPTIM_PREFIX}.{key} = {value!r} is not allowed with dataflex.mechanism = "
            f"{mechanism.config.mechanism!r}{alias}: each of its update stages steps verl's LR scheduler, which verl "
            f"sizes for one update per step; use a constant schedule without warmup (lr_scheduler_type=constant, "
            f"warmup_style=null or constant, lr_decay_style=constant on Megatron, lr_warmup_steps=0, "
            f"lr_warmup_steps_ratio=0)"
        )


def check_no_distillation(config: Mapping[str, Any], mechanism: Mechanism) -> None:
    distillation = to_plain(config).get("distillation") or {}
    if isinstance(distillation, Mapping) and distillation.get("enabled"):
        raise ConfigError(
            f"distillation.enabled = True is not allowed with dataflex.mechanism = {mechanism.config.mechanism!r}: "
            f"its staged updates need the dataflex actor loss (per-stage KL and entropy), which replaces verl's "
            f"distillation loss; turn distillation off or use a single-update mechanism (reweight)"
        )
