"""Every key the project names: the metric keys it logs (verl's names where verl has one, ``dataflex/...`` for the
mechanism, ``grad_norm/by_prob/...``, ``prob_change/...``, ``val/...``), then the config keys a sweep varies or
records by name (sweep axes, run identity, W&B, analysis) and the baseline."""

from __future__ import annotations

import difflib
import re

from dataflex_rl.validation import ConfigError

# The fixed scalar metric keys: the vocabulary of ``plan_metric=`` and the study's ``metric=``.
_METRIC_KEYS: set[str] = set()


def metric_key(key: str) -> str:
    """Declare ``key`` a fixed scalar metric key the local backend logs; returns it."""
    _METRIC_KEYS.add(key)
    return key


# --- mechanism (dataflex/...) -------------------------------------------------------------------------------
ACTIVE = metric_key("dataflex/active")
WEIGHT_PREFIX = "dataflex/weight"
WEIGHT_STATS = ("mean", "std", "min", "max", "p05", "p50", "p95")
WEIGHT_KEYS = tuple(metric_key(f"{WEIGHT_PREFIX}/{stat}") for stat in WEIGHT_STATS)
TOKEN_PROB_MEAN = metric_key("dataflex/token_prob/mean")
TOKEN_PROB_LOW_FRAC = metric_key("dataflex/token_prob/low_frac")
VALID_TOKENS = metric_key("dataflex/valid_tokens")
# Share of valid tokens whose weight is above 0, while active (1.0 for AR; below 1 for the masking rules).
KEPT_TOKEN_FRAC = metric_key("dataflex/kept_token_frac")
# Lopti: share of valid tokens in the low-probability group, and the split's threshold (|eta| or a quantile of pi).
LOPTI_LOW_TOKEN_FRAC = metric_key("dataflex/lopti/low_token_frac")
LOPTI_THRESHOLD = metric_key("dataflex/lopti/threshold")

# Histogram names (run store ``histograms.parquet`` column ``name``; W&B key is the same string).
HIST_WEIGHT = "dataflex/hist/weight"
HIST_TOKEN_PROB = "dataflex/hist/token_prob"
HIST_ENTROPY = "dataflex/hist/entropy"  # the old policy's per-token entropy (nats), when the batch has it

# --- rollout / reward / advantage (verl names) -------------------------------------------------------------
SCORE_MEAN = metric_key("critic/score/mean")
SCORE_MAX = metric_key("critic/score/max")
SCORE_MIN = metric_key("critic/score/min")
ADV_MEAN = metric_key("critic/advantages/mean")
ADV_MAX = metric_key("critic/advantages/max")
ADV_MIN = metric_key("critic/advantages/min")
RESPONSE_LENGTH_MEAN = metric_key("response_length/mean")
TRAIN_ACCURACY = metric_key("train/accuracy")

# --- actor update (verl names) -----------------------------------------------------------------------------
PG_LOSS = metric_key("actor/pg_loss")
GRAD_NORM = metric_key("actor/grad_norm")  # before clipping
GRAD_NORM_CLIPPED = metric_key("actor/grad_norm_clipped")  # after clipping
GRAD_CLIP_FRAC = metric_key("actor/grad_clip_frac")  # share of optimiser steps where clipping acted
SKIPPED_UPDATE_FRAC = metric_key("actor/skipped_update_frac")  # share of steps skipped for a non-finite gradient
PG_CLIPFRAC = metric_key("actor/pg_clipfrac")
PPO_KL = metric_key("actor/ppo_kl")
ENTROPY = metric_key("actor/entropy")
KL_LOSS = metric_key("actor/kl_loss")
LR = metric_key("actor/lr")
UPDATE_STAGES = metric_key("actor/update_stages")  # policy updates per step: 1, or the actuator's stages


def stage_metric(stage: int, key: str) -> str:
    """``actor/pg_loss`` of update stage 0 -> ``actor/stage0/pg_loss`` (the merged key holds the stages' mean)."""
    return f"actor/stage{stage}/{key.removeprefix('actor/')}"


# --- timing (verl names) -----------------------------------------------------------------------------------
TIMING_GEN = metric_key("timing_s/gen")
TIMING_UPDATE = metric_key("timing_s/update")
TIMING_STEP = metric_key("timing_s/step")
TIMING_MECHANISM = metric_key("timing_s/mechanism")
TIMING_LOG = metric_key("timing_s/log")  # logging of the previous step
TIMING_EXACT_GRAD = metric_key("timing_s/exact_grad")  # exact per-bucket gradient norms (stats.exact_every)
TIMING_PROB_CHANGE = metric_key("timing_s/prob_change")  # the updated policy's forward pass (stats.prob_change_every)
TIMING_VAL = metric_key("timing_s/testing")  # a validation (at the steps that have one)
# The process's start to its first step (interpreter, imports, config, task, warm-start load, loggers; a step-0
# validation excluded); logged at the first step the process trains.
TIMING_STARTUP = metric_key("timing_s/startup")

# --- validation --------------------------------------------------------------------------------------------
VAL_ACCURACY = metric_key("val/accuracy")


def val_accuracy_by_difficulty(difficulty: int) -> str:
    """``val/accuracy/d<difficulty>``: accuracy on problems of one difficulty (K&K: number of people)."""
    return f"{VAL_ACCURACY}/d{difficulty}"


# --- gradient statistics by token probability (grad_norm/by_prob/...) --------------------------------------
GRAD_BY_PROB_PREFIX = "grad_norm/by_prob"


def bucket_label(low: float, high: float) -> str:
    """Stable label of the probability bucket ``[low, high)``, e.g. ``0.00-0.25``."""
    return f"{low:.2f}-{high:.2f}"


def grad_by_prob(label: str, stat: str) -> str:
    return f"{GRAD_BY_PROB_PREFIX}/{label}/{stat}"


GRAD_LOW_PROB_SHARE = metric_key(f"{GRAD_BY_PROB_PREFIX}/low_prob_share")  # share of the gradient norm from pi < 0.5

# --- how one update moved each token's probability (prob_change/...) ------------------------------------------
PROB_CHANGE_PREFIX = "prob_change"
ADVANTAGE_SIGNS = ("pos", "neg")  # tokens with a positive / negative advantage (0: neither)
# Over every valid token with a non-zero advantage: the share whose probability moved in its advantage's direction.
PROB_CHANGE_CORRECT_SHARE = metric_key(f"{PROB_CHANGE_PREFIX}/correct_share")


def prob_change(sign: str, label: str, stat: str) -> str:
    """How one update moved ``pi`` per advantage sign and old-``pi`` bucket."""
    return f"{PROB_CHANGE_PREFIX}/{sign}/{label}/{stat}"


# --- which names are metric keys ---------------------------------------------------------------------------
# The keys the functions above build, as patterns.
_BUCKET = r"\d\.\d\d-\d\.\d\d"
METRIC_PATTERNS = (
    (re.compile(r"actor/stage\d+/[\w.]+"), "actor/stage<i>/<name>"),
    (re.compile(re.escape(VAL_ACCURACY) + r"/d\d+"), f"{VAL_ACCURACY}/d<difficulty>"),
    (re.compile(f"{re.escape(GRAD_BY_PROB_PREFIX)}/{_BUCKET}/\\w+"), f"{GRAD_BY_PROB_PREFIX}/<bucket>/<stat>"),
    (re.compile(f"{PROB_CHANGE_PREFIX}/(pos|neg)/{_BUCKET}/\\w+"), f"{PROB_CHANGE_PREFIX}/<sign>/<bucket>/<stat>"),
)


def scalar_keys() -> tuple[str, ...]:
    return tuple(sorted(_METRIC_KEYS))


def is_metric_key(key: str) -> bool:
    """Whether the local backend logs ``key`` (a fixed key or one of :data:`METRIC_PATTERNS`)."""
    return key in scalar_keys() or any(pattern.fullmatch(key) for pattern, _ in METRIC_PATTERNS)


def check_metric_key(name: str, key: object) -> str:
    """``key`` if it is a metric the local backend logs; ConfigError naming ``name``, the value and the keys."""
    if not isinstance(key, str) or not is_metric_key(key):
        close = difflib.get_close_matches(key, scalar_keys(), n=2, cutoff=0.6) if isinstance(key, str) else []
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigError(f"{name} = {key!r} is not allowed: not a metric the trainer logs{hint}; allowed: "
                          f"{', '.join(scalar_keys())}, or {', '.join(label for _, label in METRIC_PATTERNS)}")
    return key


# --- config keys a sweep varies or records by name -------------------------------------------------------
ACTUATOR_PARAMS_PREFIX = "dataflex.actuator.params."
ALPHA_KEY = f"{ACTUATOR_PARAMS_PREFIX}alpha"
ETA_KEY = f"{ACTUATOR_PARAMS_PREFIX}eta"
# The baseline every comparison is against (conf/dataflex/baseline.yaml: AR's alpha = 0, GRPO bit for bit).
BASELINE_ALPHA = 0.0
BASELINE_PRESET = "baseline"
# The sweep key ``warm_start``: ``per_seed`` (seed s warm-starts from ``sft.seed = s``) or ``shared`` (docs/sweeps.md).
WARM_START_DESIGNS = ("per_seed", "shared")
WARM_START_SEED_KEY = "sft.seed"
