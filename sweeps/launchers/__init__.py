"""Launchers: how a sweep's runs are started, one OS process (or job) per run. A launcher is one module here (a
:class:`Launcher` registered with ``@LAUNCHERS.register("<name>")``, its settings a dataclass) plus
``conf/sweeps/launcher/<name>.yaml``; docs/architecture.md lists what adding one touches."""

from __future__ import annotations

import importlib

from dataflex_rl.registry import plugin_modules
from sweeps.launchers.base import (LAUNCHERS, Job, Launcher, Outcome, RunToLaunch, build_launcher, launcher_class,
                                   parse_settings, process_matches, store_settings_schemas, write_log_header)


def discover() -> list[str]:
    for module in plugin_modules(__name__).values():
        importlib.import_module(module)
    store_settings_schemas()
    return LAUNCHERS.names()


discover()
