"""verl's CPU mode: verl 0.9.1's real V1 trainer (Ray, TransferQueue, the FSDP2 engine on gloo, the reward
manager, the checkpoint engine) on a machine without an accelerator, to test the GPU path and try a verl config on
a laptop before spending GPU hours.

Every verl process loads :mod:`dataflex_rl.verl.cpu.plugin` before verl's plugins, through two environment variables
(:data:`ENVIRONMENT`; ``VERL_USE_EXTERNAL_MODULES`` modules are imported in ``verl/__init__.py`` L49, before the
``verl.plugins`` entry points at L55-72, so the platform exists before anything asks for the device):

    VERL_PLATFORM=cpu VERL_USE_EXTERNAL_MODULES=dataflex_rl.verl.cpu.plugin python -m verl.trainer.main_ppo ...

Importing that module registers the ``cpu`` platform, the FSDP engines for ``cpu`` and the ``dataflex_cpu`` rollout, and
applies two work-arounds (:mod:`dataflex_rl.verl.cpu.patches` names each verl line). It is pinned to verl
:data:`VERL_VERSION`: on another version the import raises, naming both versions, since the work-arounds are
written against that version's lines. The settings the mode needs (no code) are in
``conf/verl_experiment/verl_cpu_tiny.yaml``; ``python -m dataflex_rl.verl.cpu.prepare`` writes the model folder
(the project's tiny model after its SFT warm start, with an HF tokenizer) and the data files it trains on.
"""

from __future__ import annotations

import importlib.metadata
import os

VERL_VERSION = "0.9.1"
PLUGIN_MODULE = "dataflex_rl.verl.cpu.plugin"
# What every verl process needs in its environment to run on the CPU (the sweep backend and the command builder
# set it; Ray workers inherit it from the process that starts Ray). RAY_prestart_worker_first_driver=0: Ray would
# start one idle worker process per logical CPU (the experiment declares 16) when the driver connects; on two cores
# that start-up cost about a third of a 2-step run (224 s -> 150 s with the dashboard off too, measured loaded).
ENVIRONMENT = {"VERL_PLATFORM": "cpu", "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
               "RAY_prestart_worker_first_driver": "0"}


class CPUModeError(RuntimeError):
    """verl's CPU mode cannot load here: another verl version, or VERL_PLATFORM not set to cpu."""


def check_verl_version() -> None:
    """Raise :class:`CPUModeError` unless verl :data:`VERL_VERSION` is installed."""
    installed = importlib.metadata.version("verl")
    if installed != VERL_VERSION:
        raise CPUModeError(
            f"verl = {installed!r} is not allowed for verl's CPU mode ({PLUGIN_MODULE}): its work-arounds are written "
            f"against verl {VERL_VERSION}'s source lines; install verl=={VERL_VERSION} or drop VERL_PLATFORM=cpu"
        )



def check_platform_selected() -> None:
    """Raise unless ``VERL_PLATFORM=cpu``: the plugin must run where verl will pick the ``cpu`` platform, or verl
    caches another platform's device name at its first look (``transformer_impl.py`` L89, at import)."""
    selected = os.environ.get("VERL_PLATFORM", "")
    if selected.strip().lower() != ENVIRONMENT["VERL_PLATFORM"]:
        raise CPUModeError(
            f"VERL_PLATFORM = {selected!r} is not allowed with {PLUGIN_MODULE}: set VERL_PLATFORM=cpu beside "
            f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} (verl's CPU mode), or unset both"
        )
