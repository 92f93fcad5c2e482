"""``meta.json``: a run's identity, config fingerprint, package versions, host and session times."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import socket
from collections.abc import Mapping
from typing import Any

from dataflex_rl.tracking.identity import RunIdentity

# meta.json keys written by the store itself; ``RunStore.write_meta(extra=...)`` may not override them.
RESERVED_META_KEYS = frozenset(
    {"versions", "host", "start_time", "end_time", "wall_time_s", "resume_times", "config_fingerprint"}
    | {field for field in RunIdentity.__dataclass_fields__}
)
_VERSIONED_DISTRIBUTIONS = {
    "torch": "torch",
    "transformers": "transformers",
    "verl": "verl",
    "dataflex_rl": "dataflex-rl",
}


def package_versions() -> dict[str, str | None]:
    """Versions from installed package metadata: no package is imported (cheap even for torch and verl)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def check_extra(extra: Mapping[str, Any]) -> None:
    """Refuse extra ``meta.json`` keys that the store writes itself (:data:`RESERVED_META_KEYS`), naming them."""
    clashing = sorted(RESERVED_META_KEYS & extra.keys())
    if clashing:
        raise ValueError(f"write_meta extra keys {clashing} are reserved; reserved keys: {sorted(RESERVED_META_KEYS)}")


def session_meta(
    identity: RunIdentity,
    previous: Mapping[str, Any],
    fingerprint: str | None,
    extra: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """The ``meta.json`` of a session starting at ``now`` (ISO 8601), given the ``previous`` one (``{}`` for a new run).

    A resumed run keeps its first ``start_time`` and appends ``now`` to ``resume_times``; ``end_time`` and
    ``wall_time_s`` are null until :func:`with_end_time`. ``extra`` keys (checked by :func:`check_extra`) come last.
    """
    meta: dict[str, Any] = {
        **identity.to_dict(),
        "config_fingerprint": fingerprint,
        "versions": package_versions(),
        "host": socket.gethostname(),
        "start_time": previous.get("start_time", now),
        "end_time": None,
        "wall_time_s": None,
    }
    if "start_time" in previous:
        meta["resume_times"] = [*previous.get("resume_times", []), now]
    meta.update(extra)
    return meta


def with_end_time(meta: Mapping[str, Any], end: str) -> dict[str, Any]:
    """``meta`` stamped with ``end_time`` and ``wall_time_s = end_time - start_time`` (for a resumed run, including
    the time between sessions)."""
    wall = datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(meta["start_time"])
    return {**meta, "end_time": end, "wall_time_s": wall.total_seconds()}
