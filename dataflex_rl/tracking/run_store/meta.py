"""Where a run's numbers came from, as ``meta.json`` records it: package versions and the numeric environment (which
CPU kernels; ``docs/run_store.md``, "The numeric environment")."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
from collections.abc import Mapping
from typing import Any

_VERSIONED_DISTRIBUTIONS = {"torch": "torch", "transformers": "transformers", "verl": "verl",
                            "dataflex_rl": "dataflex-rl"}


def package_versions() -> dict[str, str | None]:
    """Versions from installed package metadata: no package is imported (cheap even for torch and verl)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        versions[key] = None
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[key] = importlib.metadata.version(distribution)
    return versions


# The CPU kernel set torch dispatches to is capped by this variable (torch reads it itself, e.g. ``avx2``).
ATEN_CPU_CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
_CPUINFO = "/proc/cpuinfo"


def numeric_environment() -> dict[str, Any]:
    """What decides a run's floating-point results on the CPU, as ``meta.json``'s ``environment`` records it."""
    import torch  # imported here: the trainers have it loaded; the rest of the run store does not need it

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open(_CPUINFO, encoding="utf-8", errors="replace") as cpuinfo:
        cpu = next((value.strip() for name, _, value in (line.partition(":") for line in cpuinfo)
                    if name.strip() == "model name" and value.strip()), cpu)
    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return {"cpu": cpu,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "aten_cpu_capability": os.environ.get(ATEN_CPU_CAPABILITY_VARIABLE),
            "blas": blas.group(1) if blas else None, "threads": torch.get_num_threads(), "machine": platform.machine()}


def environment_record(previous: Mapping[str, Any], environment: Mapping[str, Any], now: str) -> dict[str, Any]:
    """``environment`` (the first session's) and ``environment_changes`` (each later session's that differs from the
    one in force, with its start ``time``) of a session starting at ``now``."""
    first = previous.get("environment", environment)
    changes = list(previous.get("environment_changes", []))
    in_force = {key: value for key, value in changes[-1].items() if key != "time"} if changes else first
    if dict(environment) != dict(in_force):
        changes.append({**environment, "time": now})
    return {"environment": first, **({"environment_changes": changes} if changes else {})}
