"""Launchers: how a sweep's runs are started, one OS process (or job) per run.

Built in: ``process`` (child processes on this machine), ``slurm`` (a submitit job array),
``ray`` (Ray Jobs). Adding a launcher is one module in this folder, a :class:`Launcher` subclass registered with
``@LAUNCHERS.register("<name>")`` (every module here is imported with the package), plus its Hydra config
``conf/sweeps/launcher/<name>.yaml``; the sweep config then accepts ``launcher=<name>`` and its ``<name>.*``
settings. See :mod:`sweeps.launchers.base` for the interface.
"""

from __future__ import annotations

import importlib

from dataflex_rl.registry import plugin_modules
from sweeps.launchers.base import (
    LAUNCHERS,
    Job,
    Launcher,
    Outcome,
    RunToLaunch,
    build_launcher,
    launcher_class,
    parse_settings,
    process_matches,
    write_log_header,
)


def discover() -> list[str]:
    """Import every module of this package (each registers its launcher); returns the registered names."""
    for module in plugin_modules(__name__).values():
        importlib.import_module(module)
    return LAUNCHERS.names()


discover()

from sweeps.launchers.process import ProcessLauncher  # noqa: E402  (registered by discover())
from sweeps.launchers.ray import RayLauncher, RaySettings  # noqa: E402
from sweeps.launchers.slurm import SlurmLauncher, SlurmSettings, run_command  # noqa: E402

__all__ = [
    "LAUNCHERS", "Job", "Launcher", "Outcome", "ProcessLauncher", "RayLauncher", "RaySettings", "RunToLaunch",
    "SlurmLauncher", "SlurmSettings", "build_launcher", "discover", "launcher_class", "parse_settings",
    "process_matches", "run_command", "write_log_header",
]
