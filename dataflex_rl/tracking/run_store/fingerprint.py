"""The config fingerprint and the resume policy: which config keys may differ when a run is continued.

A run's numbers depend on its config minus :data:`FINGERPRINT_IGNORED` keys; :data:`FINGERPRINT_GROWING` keys may
grow (extending a run continues the same trajectory). :func:`config_fingerprint` hashes the rest into ``meta.json``;
:func:`check_resume` refuses to continue a run with a config that differs in any of it.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.tracking.run_store.reader import read_config
from dataflex_rl.validation import ConfigError, to_plain

# Config keys (dotted prefixes) that cannot change a run's numbers: where its logs go, how many threads compute them
# (threads may change the last bits of float reductions, not the results), where the run folder and the SFT cache
# sit (the cache is keyed by its content).
FINGERPRINT_IGNORED: tuple[str, ...] = ("logger", "threads", "run_dir", "sft.cache_dir")
# Keys that may grow on resume: extending a run continues the same trajectory.
FINGERPRINT_GROWING: tuple[str, ...] = ("trainer.total_steps",)
_FINGERPRINT_LENGTH = 16


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"a.b.c": value}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def _numbers_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened config minus :data:`FINGERPRINT_IGNORED` and :data:`FINGERPRINT_GROWING` keys."""
    flat = flatten_config(to_plain(config))
    return {k: v for k, v in flat.items() if not _matches(k, FINGERPRINT_IGNORED + FINGERPRINT_GROWING)}


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """16 hex digits of sha256 over the keys of ``config`` that can change a run's numbers (canonical JSON).

    Two configs with the same fingerprint may differ only in :data:`FINGERPRINT_IGNORED` keys and in
    :data:`FINGERPRINT_GROWING` keys.
    """
    canonical = json.dumps(_numbers_config(config), sort_keys=True, separators=(",", ":"), default=str,
                           allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_FINGERPRINT_LENGTH]


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every key that may not differ on resume, sorted by key.

    A key present on one side only shows the other side as ``"<absent>"``. A growing key may grow, never shrink.
    """
    absent = "<absent>"
    old_flat, new_flat = flatten_config(to_plain(old)), flatten_config(to_plain(new))
    differences = []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        before, after = old_flat.get(key, absent), new_flat.get(key, absent)
        if before == after or _matches(key, FINGERPRINT_IGNORED):
            continue
        if _matches(key, FINGERPRINT_GROWING) and _grows(before, after):
            continue
        differences.append((key, before, after))
    return differences


def _grows(before: Any, after: Any) -> bool:
    numbers_only = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (before, after))
    return numbers_only and after >= before


class ConfigMismatchError(ConfigError):
    """A resume (or a sweep rerun) with a config whose numbers-relevant keys differ from the recorded one."""


def check_resume(run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
    """Refuse to continue the run in ``run_dir`` with ``config`` when they differ in a key that changes numbers.

    Compares with the recorded ``config.yaml``: nothing to compare (a fresh folder) passes. Raises
    :class:`ConfigMismatchError` naming every differing key with its recorded and its new value.
    """
    recorded = read_config(run_dir)
    if recorded is None:
        return
    differences = config_differences(recorded, config)
    if not differences:
        return
    listed = "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differences)
    raise ConfigMismatchError(
        f"run {run_dir} was recorded with a different config: {listed}. Only {', '.join(FINGERPRINT_IGNORED)} may "
        f"differ, and {', '.join(FINGERPRINT_GROWING)} may grow; use the recorded values, or a new run_dir for the "
        f"new config (or delete {run_dir} to start it again)"
    )
