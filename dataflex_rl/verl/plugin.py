"""What verl imports through the ``verl.plugins`` entry point, in every process: the policy-loss route always, the
dataflex trainer modes where verl has its V1 trainers and TransferQueue (docs/verl.md)."""

from __future__ import annotations

import dataflex_rl.verl.policy_loss  # noqa: F401  (registers loss_mode=dataflex)

# The modules the trainer modes build on and a verl may lack (its neo branch removes both).
V1_MODULES = ("transfer_queue", "verl.trainer.ppo.v1")


def v1_missing(error: ModuleNotFoundError) -> bool:
    """Whether ``error`` is the absence of one of :data:`V1_MODULES` (any other import error is a real failure)."""
    return any(error.name == module or str(error.name).startswith(f"{module}.") for module in V1_MODULES)


try:
    import dataflex_rl.verl.trainer  # noqa: F401  (registers the dataflex trainer modes)
except ModuleNotFoundError as error:
    if not v1_missing(error):
        raise
    TRAINER_MODES_MISSING: str | None = str(error.name)  # which module this verl lacks
else:
    TRAINER_MODES_MISSING = None
