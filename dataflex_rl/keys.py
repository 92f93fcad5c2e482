"""Every metric key the project writes, and the config keys of the factors a sweep varies, in one place.

Keys follow verl's names where verl has one (``critic/score/mean``, ``actor/grad_norm``, ...), ``dataflex/...``
for the mechanism, ``grad_norm/by_prob/...`` for gradient statistics by token probability and ``val/...`` for
evaluation. The run store, W&B and the analysis package all use these strings.
"""

from __future__ import annotations

import re

# The scalar metric keys, declared by :func:`metric_key` below: the vocabulary of ``plan_metric=`` and the study's
# ``metric=``. Config keys (the first section) and key prefixes are plain strings and never in it.
_METRIC_KEYS: set[str] = set()


def metric_key(key: str) -> str:
    """Declare ``key`` a fixed scalar metric key the local backend logs; returns it."""
    _METRIC_KEYS.add(key)
    return key


# --- config keys of the actuator parameters swept by name (sweep axes, run identity, W&B, analysis) -------------
ACTUATOR_PARAMS_PREFIX = "dataflex.actuator.params."
ALPHA_KEY = f"{ACTUATOR_PARAMS_PREFIX}alpha"
ETA_KEY = f"{ACTUATOR_PARAMS_PREFIX}eta"
# The baseline every comparison is against: AR's alpha = 0 is GRPO bit for bit, and the preset of this name
# (conf/dataflex/baseline.yaml) is that run; the sweep driver adds it, the analysis compares with it.
BASELINE_ALPHA = 0.0
BASELINE_PRESET = "baseline"
# A sweep's warm-start design (sweep key ``warm_start``): ``per_seed`` gives the runs of seed s the SFT warm start of
# ``sft.seed = s`` (the same for every arm of that seed, so comparisons stay paired within a warm start; the intervals
# over seeds then include the warm start's draw); ``shared`` gives every run the one warm start of the configured
# ``sft.seed`` (a result then holds for that warm start only).
WARM_START_DESIGNS = ("per_seed", "shared")
WARM_START_SEED_KEY = "sft.seed"

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
# Lopti (mechanism ``isolate``): share of valid tokens with pi < |eta| (the low-probability group), while active.
LOPTI_LOW_TOKEN_FRAC = metric_key("dataflex/lopti/low_token_frac")
# Lopti: the probability threshold of the split (|eta|, or the |eta|-quantile of pi with split: quantile).
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
GRAD_CLIP_FRAC = metric_key("actor/grad_clip_frac")  # share of optimiser steps where clipping rescaled the gradient
SKIPPED_UPDATE_FRAC = metric_key("actor/skipped_update_frac")  # share of optimiser steps skipped for a non-finite gradient
PG_CLIPFRAC = metric_key("actor/pg_clipfrac")
PPO_KL = metric_key("actor/ppo_kl")
ENTROPY = metric_key("actor/entropy")
KL_LOSS = metric_key("actor/kl_loss")
LR = metric_key("actor/lr")
UPDATE_STAGES = metric_key("actor/update_stages")  # policy updates per step: 1, or the number of a staged mechanism's stages


def stage_metric(stage: int, key: str) -> str:
    """``actor/stage<i>/<name>``: an actor metric of one update stage of a staged mechanism (``stage`` from 0).

    ``key`` is the merged metric's key (``actor/pg_loss`` -> ``actor/stage0/pg_loss``); the merged key holds the
    mean over the stages.
    """
    return f"actor/stage{stage}/{key.removeprefix('actor/')}"

# --- timing (verl names) -----------------------------------------------------------------------------------
TIMING_GEN = metric_key("timing_s/gen")
TIMING_UPDATE = metric_key("timing_s/update")
TIMING_STEP = metric_key("timing_s/step")
TIMING_MECHANISM = metric_key("timing_s/mechanism")
TIMING_LOG = metric_key("timing_s/log")  # logging of the previous step
TIMING_EXACT_GRAD = metric_key("timing_s/exact_grad")  # exact per-bucket gradient norms (every stats.exact_every steps)
TIMING_PROB_CHANGE = metric_key("timing_s/prob_change")  # the updated policy's forward pass (every stats.prob_change_every steps)

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
    """Key of one per-bucket statistic.

    ``stat`` is one of ``token_share``, ``adv_weight_abs_mean``, ``logit_grad_bound`` (mean ``|A w| (1 - pi)``,
    needs no logits: both backends), ``logit_grad_norm`` and ``logit_grad_norm_share`` (closed-form per-token
    logit-gradient norms summed over the bucket, and the bucket's share of the total: local backend, every
    step), ``param_grad_norm`` and ``param_grad_share`` (exact, every ``stats.exact_every`` steps: local).
    """
    return f"{GRAD_BY_PROB_PREFIX}/{label}/{stat}"


GRAD_LOW_PROB_SHARE = metric_key(f"{GRAD_BY_PROB_PREFIX}/low_prob_share")  # share of the logit-gradient norm from pi < 0.5

# --- how one update moved each token's probability (prob_change/...) ------------------------------------------
PROB_CHANGE_PREFIX = "prob_change"
ADVANTAGE_SIGNS = ("pos", "neg")  # tokens with a positive / negative advantage (0: neither)
# Over every valid token with a non-zero advantage: the share whose probability moved in its advantage's direction.
PROB_CHANGE_CORRECT_SHARE = metric_key(f"{PROB_CHANGE_PREFIX}/correct_share")


def prob_change(sign: str, label: str, stat: str) -> str:
    """``prob_change/<sign>/<bucket>/<stat>``: how one step's policy update moved ``pi`` of the valid tokens with a
    positive (``sign = pos``) or negative (``neg``) advantage whose old ``pi`` was in the bucket ``label``.

    ``stat``: ``mean_delta`` (mean of ``pi_new - pi_old``), ``correct_share`` (share of them whose ``pi`` moved in
    the direction of the advantage's sign, up for ``pos`` and down for ``neg``: the AR paper's "correct ratio"),
    ``token_share`` (their share of the valid tokens).
    """
    return f"{PROB_CHANGE_PREFIX}/{sign}/{label}/{stat}"


# --- which names are metric keys ---------------------------------------------------------------------------
# Keys built by the functions above, as patterns (a stage's actor metric, a difficulty's accuracy, a bucket's statistic).
METRIC_PATTERNS = (
    (re.compile(r"actor/stage\d+/[\w.]+"), "actor/stage<i>/<name>"),
    (re.compile(re.escape(VAL_ACCURACY) + r"/d\d+"), f"{VAL_ACCURACY}/d<difficulty>"),
    (re.compile(re.escape(GRAD_BY_PROB_PREFIX) + r"/\d\.\d\d-\d\.\d\d/\w+"), f"{GRAD_BY_PROB_PREFIX}/<bucket>/<stat>"),
    (re.compile(PROB_CHANGE_PREFIX + r"/(pos|neg)/\d\.\d\d-\d\.\d\d/\w+"), f"{PROB_CHANGE_PREFIX}/<sign>/<bucket>/<stat>"),
)


def scalar_keys() -> tuple[str, ...]:
    """Every fixed scalar metric key of this module (those declared with :func:`metric_key`), sorted."""
    return tuple(sorted(_METRIC_KEYS))


def is_metric_key(key: str) -> bool:
    """Whether the local backend logs ``key`` (a fixed key or one of :data:`METRIC_PATTERNS`)."""
    return key in scalar_keys() or any(pattern.fullmatch(key) for pattern, _ in METRIC_PATTERNS)


def check_metric_key(name: str, key: object) -> str:
    """``key`` if it is a metric the local backend logs; ConfigError naming ``name``, the value and the keys."""
    from dataflex_rl.validation import ConfigError

    if not isinstance(key, str) or not is_metric_key(key):
        import difflib

        close = difflib.get_close_matches(key, scalar_keys(), n=2, cutoff=0.6) if isinstance(key, str) else []
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ConfigError(f"{name} = {key!r} is not allowed: not a metric the trainer logs{hint}; allowed: "
                          f"{', '.join(scalar_keys())}, or {', '.join(label for _, label in METRIC_PATTERNS)}")
    return key
