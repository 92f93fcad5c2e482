"""``meta.json``: a run's identity, config fingerprint, package versions, host, numeric environment (which CPU
kernels its numbers came from) and session times (``docs/run_store.md``, "The numeric environment")."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import socket
from collections.abc import Mapping
from typing import Any

from dataflex_rl.tracking.identity import RunIdentity

# meta.json keys written by the store itself; ``RunStore.write_meta(extra=...)`` may not override them.
RESERVED_META_KEYS = frozenset({"versions", "host", "environment", "environment_changes", "start_time", "end_time",
                                "wall_time_s", "resume_times", "config_fingerprint", *RunIdentity.__dataclass_fields__})
_VERSIONED_DISTRIBUTIONS = {"torch": "torch", "transformers": "transformers", "verl": "verl",
                            "dataflex_rl": "dataflex-rl"}


def package_versions() -> dict[str, str | None]:
    """Versions from installed package metadata: no package is imported (cheap even for torch and verl)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


# The CPU kernel set torch dispatches to is capped by this variable (torch reads it itself, e.g. ``avx2``).
ATEN_CPU_CAPABILITY_VARIABLE = "ATEN_CPU_CAPABILITY"
_CPUINFO = "/proc/cpuinfo"


def _cpu_model() -> str:
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if name.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numeric_environment() -> dict[str, Any]:
    """What decides a run's floating-point results on the CPU, as ``meta.json``'s ``environment`` records it."""
    import torch  # imported here: the trainers have it loaded; the rest of the run store does not need it

    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return {"cpu": _cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "aten_cpu_capability": os.environ.get(ATEN_CPU_CAPABILITY_VARIABLE),
            "blas": blas.group(1) if blas else None, "threads": torch.get_num_threads(), "machine": platform.machine()}


def _environment_record(previous: Mapping[str, Any], environment: Mapping[str, Any], now: str) -> dict[str, Any]:
    first = previous.get("environment", environment)
    changes = list(previous.get("environment_changes", []))
    in_force = {key: value for key, value in changes[-1].items() if key != "time"} if changes else first
    if dict(environment) != dict(in_force):
        changes.append({**environment, "time": now})
    return {"environment": first, **({"environment_changes": changes} if changes else {})}


def check_extra(extra: Mapping[str, Any]) -> None:
    """Refuse extra ``meta.json`` keys that the store writes itself (:data:`RESERVED_META_KEYS`), naming them."""
    clashing = sorted(RESERVED_META_KEYS & extra.keys())
    if clashing:
        raise ValueError(f"write_meta extra keys {clashing} are reserved; reserved keys: {sorted(RESERVED_META_KEYS)}")


def session_meta(identity: RunIdentity, previous: Mapping[str, Any], fingerprint: str | None, extra: Mapping[str, Any],
                 now: str) -> dict[str, Any]:
    """The ``meta.json`` of a session starting at ``now`` given the ``previous`` one (``{}`` for a new run)."""
    meta: dict[str, Any] = {**identity.to_dict(),
                            "config_fingerprint": fingerprint, "versions": package_versions(),
                            "host": socket.gethostname(), **_environment_record(previous, numeric_environment(), now),
                            "start_time": previous.get("start_time", now), "end_time": None, "wall_time_s": None}
    if "start_time" in previous:
        meta["resume_times"] = [*previous.get("resume_times", []), now]
    meta.update(extra)
    return meta


def with_end_time(meta: Mapping[str, Any], end: str) -> dict[str, Any]:
    """``meta`` with ``end_time`` and ``wall_time_s`` (for a resumed run, including the time between sessions)."""
    wall = datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(meta["start_time"])
    return {**meta, "end_time": end, "wall_time_s": wall.total_seconds()}
