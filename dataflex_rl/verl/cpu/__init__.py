"""verl's CPU mode: verl's real V1 trainer without an accelerator (docs/verl.md)."""

import importlib.metadata
import os

from dataflex_rl.verl import VERL_VERSION

PLUGIN_MODULE = "dataflex_rl.verl.cpu.plugin"
PLATFORM = "cpu"  # verl's platform and device name
ROLLOUT_NAME = CHECKPOINT_ENGINE_NAME = "dataflex_cpu"  # the rollout's and the checkpoint engine's registered names
# Every verl process's environment (Ray workers inherit it); prestart 0 saves a third of a 2-step run on 2 cores.
ENVIRONMENT = {"VERL_PLATFORM": PLATFORM, "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
               "RAY_prestart_worker_first_driver": "0"}


class CPUModeError(RuntimeError):
    """verl's CPU mode cannot load here: another verl version, or VERL_PLATFORM not set to cpu."""


def check_verl_version() -> None:
    installed = importlib.metadata.version("verl")
    if installed != VERL_VERSION:
        raise CPUModeError(
            f"verl = {installed!r} is not allowed for verl's CPU mode ({PLUGIN_MODULE}): its work-arounds are written "
            f"against verl {VERL_VERSION}'s source lines; install verl=={VERL_VERSION} or drop VERL_PLATFORM=cpu"
        )


def check_platform_selected() -> None:
    """Raise unless ``VERL_PLATFORM=cpu`` (verl caches the device name at its first look)."""
    selected = os.environ.get("VERL_PLATFORM", "")
    if selected.strip().lower() != PLATFORM:
        raise CPUModeError(
            f"VERL_PLATFORM = {selected!r} is not allowed with {PLUGIN_MODULE}: set VERL_PLATFORM=cpu beside "
            f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} (verl's CPU mode), or unset both"
        )
