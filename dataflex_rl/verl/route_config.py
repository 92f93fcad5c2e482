"""The policy-loss route's config class, which verl builds from the route's ``_target_`` override (docs/verl.md).

It imports only verl's config, so when the route itself fails to import (a broken install), building it fails with
the reason, in verl's driver before Ray starts: Hydra hides the cause of a ``_target_`` it cannot import, and verl
logs a plugin's import error at DEBUG level only.
"""

import dataclasses
from typing import Any, Optional

from verl.workers.config import PolicyLossConfig


@dataclasses.dataclass
class DataflexPolicyLossConfig(PolicyLossConfig):
    """verl's policy-loss config plus the route's: the run's ``dataflex`` block, the loss under the rule
    (``base_loss_mode``, any registered verl loss, vanilla by default), and whether the loss returns the
    mechanism's histograms as metrics (``histograms``: one metric per bin, for the run store's recorder)."""

    dataflex: Optional[dict[str, Any]] = None
    base_loss_mode: str = PolicyLossConfig.loss_mode
    histograms: bool = False

    def __post_init__(self) -> None:
        # verl builds this config in its driver's validate_config, before Ray starts, and again in every worker.
        try:
            from dataflex_rl.verl import policy_loss
        except Exception as error:  # whatever a broken install raises is the reason the user needs
            raise ImportError(f"the policy-loss route dataflex_rl.verl.policy_loss does not import: "
                              f"{type(error).__name__}: {error}") from error
        policy_loss.check_route(self)
