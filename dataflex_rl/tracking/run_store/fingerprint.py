"""The config fingerprint (a hash of the config keys that can change a run's numbers) and the resume policy: which
keys may differ when a run is continued (``docs/run_store.md``, "The config fingerprint")."""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.hashing import stable_hash
from dataflex_rl.tracking.run_store.reader import read_config
from dataflex_rl.validation import ConfigError, to_plain

# Config keys (dotted prefixes) that cannot change a run's numbers: logging, threads, the run folder, the SFT cache.
FINGERPRINT_IGNORED: tuple[str, ...] = ("logger", "threads", "run_dir", "sft.cache_dir")
# Keys that may grow on resume: extending a run continues the same trajectory.
FINGERPRINT_GROWING: tuple[str, ...] = ("trainer.total_steps",)


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
    flat = flatten_config(to_plain(config))
    return {k: v for k, v in flat.items() if not _matches(k, FINGERPRINT_IGNORED + FINGERPRINT_GROWING)}


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """16 hex digits of ``stable_hash`` of ``config`` without the ignored and growing keys."""
    return stable_hash(_numbers_config(config), 16)


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` per key that may not differ on resume, sorted; a growing key may only grow."""
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
    """:class:`ConfigMismatchError` when ``config`` differs from the recorded one in a key that changes numbers."""
    recorded = read_config(run_dir)
    differences = config_differences(recorded, config) if recorded is not None else []
    if not differences:
        return
    listed = "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differences)
    raise ConfigMismatchError(
        f"run {run_dir} was recorded with a different config: {listed}. Only {', '.join(FINGERPRINT_IGNORED)} may "
        f"differ, and {', '.join(FINGERPRINT_GROWING)} may grow; use the recorded values, or a new run_dir for the "
        f"new config (or delete {run_dir} to start it again)"
    )
