"""Config keys a sweep varies or records by name (sweep axes, run identity, W&B, analysis), and the baseline."""

from __future__ import annotations

ACTUATOR_PARAMS_PREFIX = "dataflex.actuator.params."
ALPHA_KEY = f"{ACTUATOR_PARAMS_PREFIX}alpha"
ETA_KEY = f"{ACTUATOR_PARAMS_PREFIX}eta"
# The baseline every comparison is against (conf/dataflex/baseline.yaml: AR's alpha = 0, GRPO bit for bit).
BASELINE_ALPHA = 0.0
BASELINE_PRESET = "baseline"
# The sweep key ``warm_start``: ``per_seed`` (seed s warm-starts from ``sft.seed = s``) or ``shared`` (docs/sweeps.md).
WARM_START_DESIGNS = ("per_seed", "shared")
WARM_START_SEED_KEY = "sft.seed"
