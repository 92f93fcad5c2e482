"""Whether a record and a config agree: the config fingerprint and the resume check (which keys may differ when a run
is continued), and :func:`verify_run`, the one check the sweep driver and the analysis call before believing a run
(docs/run_store.md, "The config fingerprint" and "A record that checks itself")."""

from __future__ import annotations

import math
import numbers
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow.parquet as pq

from dataflex_rl.hashing import stable_hash
from dataflex_rl.keys import ALPHA_KEY
from dataflex_rl.tracking.identity import AXIS_NAMES, SEED_AXIS, axis_values, config_hash
from dataflex_rl.tracking.run_store.files import CONFIG_FILE, META_FILE, METRICS_JSONL, METRICS_PARQUET, STATUS_FILE
from dataflex_rl.tracking.run_store.reader import read_config, read_meta, read_status
from dataflex_rl.tracking.run_store.status import COMPLETED
from dataflex_rl.validation import ConfigError, to_plain

# Config keys (dotted prefixes) that cannot change a run's numbers: logging, threads, the run folder, the SFT cache.
FINGERPRINT_IGNORED: tuple[str, ...] = ("logger", "threads", "run_dir", "sft.cache_dir")
# Keys that may grow on resume: extending a run continues the same trajectory.
FINGERPRINT_GROWING: tuple[str, ...] = ("trainer.total_steps",)
# The config key of each short factor name (the inverse of identity.AXIS_NAMES).
_AXIS_KEYS = {name: key for key, name in AXIS_NAMES.items()}
# A config holding this block is verl's own: the block keeps the run's seed and swept keys.
_RUN_BLOCK = "dataflex_run"
_ABSENT = object()


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"a.b.c": value}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def config_fingerprint(config: Mapping[str, Any]) -> str:
    flat = flatten_config(to_plain(config))
    ignored = FINGERPRINT_IGNORED + FINGERPRINT_GROWING
    return stable_hash({key: value for key, value in flat.items() if not _matches(key, ignored)}, 16)


class ConfigMismatchError(ConfigError):
    """A resume (or a sweep rerun) with a config whose numbers-relevant keys differ from the recorded one."""


def check_resume(run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
    """:class:`ConfigMismatchError` when ``config`` differs from the recorded one in a key that changes numbers (a
    growing key may only grow)."""
    recorded = read_config(run_dir)
    if recorded is None:
        return
    old, new = flatten_config(to_plain(recorded)), flatten_config(to_plain(config))
    differences = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key, "<absent>"), new.get(key, "<absent>")
        grows = _matches(key, FINGERPRINT_GROWING) and _is_number(before) and _is_number(after) and after >= before
        if before != after and not _matches(key, FINGERPRINT_IGNORED) and not grows:
            differences.append(f"{key}: recorded {before!r}, now {after!r}")
    if differences:
        raise ConfigMismatchError(
            f"run {run_dir} was recorded with a different config: {'; '.join(differences)}. Only "
            f"{', '.join(FINGERPRINT_IGNORED)} may differ, and {', '.join(FINGERPRINT_GROWING)} may grow; use the "
            f"recorded values, or a new run_dir for the new config (or delete {run_dir} to start it again)")


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity fields ``config`` determines, as the trainer that wrote it records them in ``meta.json``."""
    identity: dict[str, Any] = {"config_hash": config_hash(config)}
    alpha = _lookup(config, ALPHA_KEY)
    if _is_number(alpha):
        identity["alpha"] = float(alpha)
    verl = isinstance(config.get(_RUN_BLOCK), Mapping)
    seed_keys = (f"{_RUN_BLOCK}.seed", "data.seed") if verl else ("seed",)
    seed = next((value for value in (_lookup(config, key) for key in seed_keys) if value is not _ABSENT), _ABSENT)
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        identity["seed"] = int(seed)
    axis_keys = _lookup(config, f"{_RUN_BLOCK}.axes" if verl else "axes")
    if isinstance(axis_keys, list) and all(isinstance(key, str) for key in axis_keys):
        axes = axis_values(config, axis_keys)
        if verl and SEED_AXIS in axes and "seed" in identity:
            axes[SEED_AXIS] = identity["seed"]
        identity["axes"] = axes
    return identity


def _same(recorded: Any, expected: Any) -> bool:
    both_nan = _is_number(recorded) and _is_number(expected) and math.isnan(recorded) and math.isnan(expected)
    return recorded == expected or both_nan


def _axes_differences(recorded: Any, config: Mapping[str, Any], expected: Mapping[str, Any] | None) -> list[str]:
    recorded = dict(recorded) if isinstance(recorded, Mapping) else {}
    if expected is None:  # the config lists no axes: compare those it holds a value for
        expected = {}
        for name in recorded:
            value = _lookup(config, _AXIS_KEYS.get(name, name))
            if value is not _ABSENT:
                expected[name] = axis_values({"value": value}, ["value"])["value"]
        recorded = {name: value for name, value in recorded.items() if name in expected}
    return [f"{name} {recorded.get(name, '<absent>')!r} vs {expected.get(name, '<absent>')!r}"
            for name in sorted(recorded.keys() | expected.keys())
            if not _same(recorded.get(name, _ABSENT), expected.get(name, _ABSENT))]


def identity_differences(meta: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """How ``meta.json`` disagrees with ``config.yaml``."""
    differences = []
    fingerprint, recorded = config_fingerprint(config), meta.get("config_fingerprint")
    if recorded is None:
        differences.append("meta.json records no config_fingerprint, so config.yaml cannot be checked against the "
                           "config the run recorded")
    elif recorded != fingerprint:
        differences.append(f"config.yaml is not the config the run recorded (its fingerprint is {fingerprint}, "
                           f"meta.json records {recorded!r})")
    expected = config_identity(config)
    if meta.get("config_hash") != expected["config_hash"]:
        differences.append(f"meta.json's config_hash {meta.get('config_hash')!r} is not config.yaml's "
                           f"{expected['config_hash']!r}")
    for field in ("alpha", "seed"):
        if meta.get(field) is not None and field in expected and not _same(meta[field], expected[field]):
            differences.append(f"meta.json says {field} {meta[field]!r}, config.yaml says {expected[field]!r}")
    axes = _axes_differences(meta.get("axes"), config, expected.get("axes"))
    if axes:
        differences.append(f"meta.json's axes differ from config.yaml's ({'; '.join(axes)})")
    return differences


def _read(read: Callable[[pathlib.Path], Any], run_dir: pathlib.Path, name: str, reasons: list[str]) -> Any:
    try:
        payload = read(run_dir)
    except (OSError, ValueError) as error:
        reasons.append(f"unreadable {name} ({error})")
        return None
    if payload is None:
        reasons.append(f"no {name}")
    return payload


def verify_run(run_dir: str | os.PathLike[str]) -> list[str]:
    """The reasons the run folder cannot be trusted, each naming the file or what disagrees; never raises."""
    run_dir = pathlib.Path(run_dir)
    if run_dir.is_symlink():
        return [f"the run folder is a symbolic link (to {os.readlink(run_dir)}), not the run's own folder"]
    if not run_dir.is_dir():
        return ["the run folder is not a folder" if run_dir.exists() else "no run folder"]
    reasons: list[str] = []
    _read(read_status, run_dir, STATUS_FILE, reasons)
    meta = _read(read_meta, run_dir, META_FILE, reasons)
    config = _read(read_config, run_dir, CONFIG_FILE, reasons)
    if meta is not None and config is not None:
        reasons += identity_differences(meta, config)
    return reasons + metrics_problems(run_dir)


def metrics_problems(run_dir: pathlib.Path) -> list[str]:
    """``metrics.parquet`` whose footer cannot be read (a cut or overwritten file) with no ``metrics.jsonl`` left to
    read instead, or a completed run with no metrics file at all."""
    if (run_dir / METRICS_JSONL).is_file():
        return []
    if (run_dir / METRICS_PARQUET).is_file():
        try:
            pq.ParquetFile(run_dir / METRICS_PARQUET).close()
        except Exception as error:  # noqa: BLE001  (pyarrow raises ArrowInvalid, OSError, ...: all mean unreadable)
            return [f"unreadable {METRICS_PARQUET} ({type(error).__name__}: {error})"]
        return []
    try:
        completed = (read_status(run_dir) or {}).get("state") == COMPLETED
    except (OSError, ValueError):
        completed = False
    return [f"status.json says completed, but there is no {METRICS_PARQUET} or {METRICS_JSONL}"] if completed else []
