"""A verl run's config: trainer modes, composing verl's config, and the trainer's build-time checks."""

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dataflex_rl.compose import compose_config
from dataflex_rl.dataflex_block import build_mechanism
from dataflex_rl.mechanism import Mechanism
from dataflex_rl.validation import ConfigError, check_keys, check_non_negative_int, to_plain

VERL_ENTRY_MODULE = "verl.trainer.main_ppo"
TRAINER_MODE_KEY = "trainer.v1.trainer_mode"
USE_V1_KEY = "trainer.use_v1"
# The policy-loss route (dataflex_rl.verl.policy_loss): verl's policy loss with the rule inside, its config class
# (which carries the dataflex block to the actor workers) and the overrides that select it in any verl trainer.
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
LOSS_MODE_KEY = f"{POLICY_LOSS_KEY}.loss_mode"
LOSS_MODE = "dataflex"
ROUTE_CONFIG_CLASS = "dataflex_rl.verl.route_config.DataflexPolicyLossConfig"
ROUTE_OVERRIDES = (f"{LOSS_MODE_KEY}={LOSS_MODE}", f"{POLICY_LOSS_KEY}._target_={ROUTE_CONFIG_CLASS}",
                   f"+{POLICY_LOSS_KEY}.dataflex=${{dataflex}}")
# verl's own trainers the command builder runs the route in (the experiment variable trainer_mode), and the override
# that picks each: V0 is verl's legacy RayPPOTrainer (the default again on verl's neo branch), sync its V1 trainer.
ROUTE_TRAINERS = {"v0": f"{USE_V1_KEY}=false", "sync": f"{TRAINER_MODE_KEY}=sync"}
# The dataflex trainers (registered by dataflex_rl.verl.trainer, one per verl V1 mode) and the verl mode each runs as.
TRAINER_MODES = {"dataflex_sync": "sync", "dataflex_colocate_async": "colocate_async",
                 "dataflex_separate_async": "separate_async"}
DEFAULT_TRAINER_MODE = "dataflex_sync"
# What a refusal of the policy-loss route names as the way to run the rule instead.
TRAINER_MODE_HINT = f"trainer.v1.trainer_mode={DEFAULT_TRAINER_MODE} (or {', '.join(list(TRAINER_MODES)[1:])})"
CHECKPOINT_BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
EXAMPLE_OVERRIDES = ("+dataflex.mechanism=reweight +dataflex.scorer.name=token_prob "
                     "+dataflex.actuator.name=advantage_reweight +dataflex.actuator.params.alpha=0.5")
STATS_BLOCK = "dataflex_stats"
STATS_KEYS = ("prob_change_every",)
BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"
OPTIM_KEY = "actor_rollout_ref.actor.optim"
# Besides the schedule type, the optimiser keys through which verl 0.9.1 warms the learning rate up.
WARMUP_KEYS = ("lr_warmup_steps", "lr_warmup_steps_ratio")


def check_trainer_mode(mode: Any, where: str = TRAINER_MODE_KEY, *, with_route: bool = True) -> str:
    """A dataflex trainer, or (``with_route``) one of verl's own trainers that runs the policy-loss route."""
    if mode not in TRAINER_MODES and not (with_route and mode in ROUTE_TRAINERS):
        route = (f", or verl's own trainers {list(ROUTE_TRAINERS)} with the rule in the policy loss ({LOSS_MODE_KEY}="
                 f"{LOSS_MODE})" if with_route else f"; or keep verl's trainer and add the policy-loss route: "
                 f"{' '.join(ROUTE_OVERRIDES)}")
        raise ConfigError(f"{where} = {mode!r} is not allowed: the dataflex trainers are {list(TRAINER_MODES)} "
                          f"(verl's modes {list(TRAINER_MODES.values())} with the mechanism){route}")
    return mode


def trainer_mode(config: Any) -> str | None:
    """The V1 trainer mode of a composed config; None in verl's V0 trainer."""
    return OmegaConf.select(config, TRAINER_MODE_KEY) if OmegaConf.select(config, USE_V1_KEY) else None


def route_of(config: Any) -> str:
    """``"trainer"`` (a dataflex trainer reweights the batch's advantages) or ``"policy_loss"`` (verl's own trainer,
    the rule inside verl's policy loss); anything else is refused, naming both."""
    mode = trainer_mode(config)
    if OmegaConf.select(config, LOSS_MODE_KEY) == LOSS_MODE:
        if mode in TRAINER_MODES:
            raise ConfigError(f"{LOSS_MODE_KEY} = {LOSS_MODE!r} is not allowed with {TRAINER_MODE_KEY}={mode}: that "
                              f"trainer reweights the advantages already, the loss would reweight them again; use "
                              f"one route (trainer.v1.trainer_mode=sync, or trainer.use_v1=false, for the loss)")
        return "policy_loss"
    if mode is None:
        raise ConfigError(f"{USE_V1_KEY} = False is not allowed without the policy-loss route: verl's legacy trainer "
                          f"runs the rule in its loss only; add {' '.join(ROUTE_OVERRIDES)}")
    check_trainer_mode(mode, with_route=False)
    return "trainer"


def compose_verl_config(overrides: Sequence[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides``, resolved, as ``python -m verl.trainer.main_ppo`` builds it."""
    import verl

    config = compose_config("ppo_trainer", overrides, Path(verl.__file__).resolve().parent / "trainer" / "config")
    try:
        OmegaConf.resolve(config)
    except Exception as error:  # an interpolation an override broke
        raise ConfigError(f"verl config does not compose: {type(error).__name__}: {error}") from None
    return config


def validate_overrides(overrides: Sequence[str], environment: Mapping[str, str] | None = None) -> tuple[Any, Any, Any]:
    config = compose_verl_config(overrides)
    return (config, *validate_config(config, environment))


def validate_config(config: Any, environment: Mapping[str, str] | None = None) -> tuple[Mechanism, Any]:
    """What the trainer or the route's config class refuses when verl builds it, and the CPU mode's needs."""
    from dataflex_rl.verl.cpu import CHECKPOINT_ENGINE_NAME, PLATFORM, ROLLOUT_NAME
    from dataflex_rl.verl.run_record import run_place

    route = route_of(config)
    if (environment or {}).get("VERL_PLATFORM") == PLATFORM:
        rollout = OmegaConf.select(config, "actor_rollout_ref.rollout.name")
        if rollout != ROLLOUT_NAME:
            raise ConfigError(f"actor_rollout_ref.rollout.name = {rollout!r} is not allowed in verl's CPU mode: "
                              f"it needs {ROLLOUT_NAME} (vLLM, SGLang and TRT-LLM need GPUs)")
        backend, mode = OmegaConf.select(config, CHECKPOINT_BACKEND_KEY), trainer_mode(config)
        if TRAINER_MODES.get(mode, mode) == "separate_async" and backend != CHECKPOINT_ENGINE_NAME:
            raise ConfigError(f"{CHECKPOINT_BACKEND_KEY} = {backend!r} is not allowed with {TRAINER_MODE_KEY}="
                              f"{mode} in verl's CPU mode: its rollout pool gets the weights through "
                              f"{CHECKPOINT_ENGINE_NAME} (verl's engines need GPUs or RDMA)")
    if route == "trainer":
        mechanism = mechanism_from_verl_config(config)
        prob_change_every(config)
    else:
        mechanism = check_route_config(config)
    return mechanism, run_place(config, mechanism.config.mechanism)


def check_route_config(config: Any) -> Mechanism:
    """The policy-loss route of a composed config: its config class built as verl's driver builds it (which runs
    the route's own checks, policy_loss.check_route), then what only the whole config shows."""
    from hydra.errors import InstantiationException
    from verl.utils.config import omega_conf_to_dataclass

    node = OmegaConf.select(config, POLICY_LOSS_KEY)
    route = f"{LOSS_MODE_KEY}={LOSS_MODE}"
    if node.get("_target_") != ROUTE_CONFIG_CLASS:
        raise ConfigError(f"{POLICY_LOSS_KEY}._target_ = {node.get('_target_')!r} is not allowed with {route}: the "
                          f"route's config class carries the dataflex block to the actor workers; add "
                          f"{ROUTE_OVERRIDES[1]} {ROUTE_OVERRIDES[2]}")
    if to_plain(node.get("dataflex")) != to_plain(config.get("dataflex")):
        raise ConfigError(f"{POLICY_LOSS_KEY}.dataflex is not allowed to differ from the run's dataflex block, which "
                          f"the run store records: set it with {ROUTE_OVERRIDES[2]}")
    try:
        omega_conf_to_dataclass(node)
    except InstantiationException as error:  # Hydra wraps what the class raised
        raise (error.__cause__ if isinstance(error.__cause__, ConfigError) else error) from None
    if OmegaConf.select(config, BYPASS_KEY):
        raise ConfigError(f"{BYPASS_KEY} = True is not allowed with {route}: verl's bypass mode sets the loss mode "
                          f"to its own (bypass_mode), so the rule would not run; use a dataflex trainer mode, "
                          f"{TRAINER_MODE_HINT}")
    if prob_change_every(config):
        raise ConfigError(f"{STATS_BLOCK}.prob_change_every = {prob_change_every(config)} is not allowed with "
                          f"{route}: it measures an update with one more forward pass the trainer runs; use a "
                          f"dataflex trainer mode, {TRAINER_MODE_HINT}")
    return build_mechanism(to_plain(config["dataflex"]))


def mechanism_from_verl_config(config: Mapping[str, Any]) -> Mechanism:
    block = config.get("dataflex") if isinstance(config, Mapping) else None
    if block is None:
        raise ConfigError(f"dataflex: missing; the dataflex trainers and the policy-loss route read the rule from a "
                          f"dataflex block on the verl command line, e.g. {EXAMPLE_OVERRIDES}")
    mechanism = build_mechanism(to_plain(block))
    plain = to_plain(config)
    if "entropy" in mechanism.required_fields and lookup(plain, BYPASS_KEY):
        raise ConfigError(
            f"{BYPASS_KEY} = True is not allowed with dataflex.scorer.name = {mechanism.config.scorer.name!r}: "
            f"under bypass mode verl computes no old-policy entropy; set {BYPASS_KEY}=False or use a scorer that "
            f"reads old_log_probs only (token_prob)")
    if mechanism.staged:
        check_constant_schedule(lookup(plain, OPTIM_KEY) or {}, mechanism)
        if lookup(plain, "distillation.enabled"):
            raise ConfigError(
                f"distillation.enabled = True is not allowed with dataflex.mechanism = "
                f"{mechanism.config.mechanism!r}: its staged updates need the dataflex actor loss (per-stage KL and "
                f"entropy), which replaces verl's distillation loss; turn distillation off or use a single-update "
                f"mechanism (reweight)")
    return mechanism


def lookup(plain: Any, key: str) -> Any:  # None where a level of the dotted key is missing
    for part in key.split("."):
        plain = plain.get(part) if isinstance(plain, Mapping) else None
    return plain


def prob_change_every(config: Mapping[str, Any]) -> int:
    block = to_plain(config.get(STATS_BLOCK)) if isinstance(config, Mapping) else None
    if block is None:
        return 0
    if not isinstance(block, Mapping):
        raise ConfigError(f"{STATS_BLOCK} = {block!r} is not allowed: it must be a mapping with keys {STATS_KEYS}")
    check_keys(STATS_BLOCK, block, STATS_KEYS)
    return check_non_negative_int(f"{STATS_BLOCK}.prob_change_every", block.get("prob_change_every", 0))


def check_constant_schedule(optim: Mapping[str, Any], mechanism: Mechanism) -> None:
    """Each update stage steps verl's LR scheduler, which verl sizes for one update per step."""
    # warmup_style (FSDP's old name) overrides lr_scheduler_type when set; lr_decay_style is Megatron's.
    schedule = "warmup_style" if optim.get("warmup_style") is not None else "lr_scheduler_type"
    moving = [(key, optim.get(key)) for key in (schedule, "lr_decay_style")
              if optim.get(key) not in ("constant", None)]
    moving += [(key, optim[key]) for key in WARMUP_KEYS if (optim.get(key) or 0) > 0]
    if moving:
        key, value = moving[0]
        alias = " (verl's deprecated name of lr_scheduler_type, which it overrides)" if key == "warmup_style" else ""
        raise ConfigError(
            f"{OPTIM_KEY}.{key} = {value!r} is not allowed with dataflex.mechanism = "
            f"{mechanism.config.mechanism!r}{alias}: each of its update stages steps verl's LR scheduler, which verl "
            f"sizes for one update per step; use a constant schedule without warmup (lr_scheduler_type=constant, "
            f"warmup_style=null or constant, lr_decay_style=constant on Megatron, lr_warmup_steps=0, "
            f"lr_warmup_steps_ratio=0)"
        )
