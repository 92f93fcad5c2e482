"""What verl imports through the ``verl.plugins`` entry point, in every process: the policy-loss route always, the
dataflex trainer modes where verl has its V1 trainers and TransferQueue (docs/verl.md)."""

import dataflex_rl.verl.policy_loss  # noqa: F401  (registers loss_mode=dataflex)

# The modules the trainer modes build on and a verl may lack (its neo branch removes both).
V1_MODULES = ("transfer_queue", "verl.trainer.ppo.v1")

try:
    import dataflex_rl.verl.trainer  # noqa: F401  (registers the dataflex trainer modes)
except ModuleNotFoundError as error:
    if not any(error.name == module or str(error.name).startswith(f"{module}.") for module in V1_MODULES):
        raise  # any other missing module is a broken install, not a verl without the modes
    TRAINER_MODES_MISSING: str | None = str(error.name)  # which module this verl lacks
else:
    TRAINER_MODES_MISSING = None
