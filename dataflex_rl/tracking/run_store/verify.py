"""Whether a run folder's record can be trusted (:func:`verify_run`): the one check the sweep driver and the
analysis call before believing a run (what it checks: ``docs/run_store.md``, "A record that checks itself")."""

from __future__ import annotations

import math
import numbers
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow.parquet as pq

from dataflex_rl.keys import ALPHA_KEY
from dataflex_rl.tracking.identity import AXIS_NAMES, SEED_AXIS, axis_values, config_hash
from dataflex_rl.tracking.run_store.files import CONFIG_FILE, META_FILE, METRICS_JSONL, METRICS_PARQUET, STATUS_FILE
from dataflex_rl.tracking.run_store.fingerprint import config_fingerprint
from dataflex_rl.tracking.run_store.reader import read_config, read_meta, read_status
from dataflex_rl.tracking.run_store.status import COMPLETED

# The config key of each short factor name (the inverse of identity.AXIS_NAMES).
_AXIS_KEYS = {name: key for key, name in AXIS_NAMES.items()}
# A config holding this block is verl's own: the block keeps the run's seed and swept keys.
_RUN_BLOCK = "dataflex_run"
_ABSENT = object()


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
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, bool):
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
    numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (recorded, expected))
    return recorded == expected or (numeric and math.isnan(recorded) and math.isnan(expected))


def _axes_differences(recorded: Any, config: Mapping[str, Any], expected: Mapping[str, Any] | None) -> list[str]:
    recorded = dict(recorded) if isinstance(recorded, Mapping) else {}
    if expected is None:
        expected = {}
        for name in recorded:
            value = _lookup(config, _AXIS_KEYS.get(name, name))
            if value is not _ABSENT:
                expected[name] = axis_values({"value": value}, ["value"])["value"]
        recorded = {name: value for name, value in recorded.items() if name in expected}
    return [f"{name} {recorded.get(name, '<absent>')!r} vs {expected.get(name, '<absent>')!r}"
            for name in sorted(recorded.keys() | expected.keys())
            if not _same(recorded.get(name, _ABSENT), expected.get(name, _ABSENT))]


def _read(read: Callable[[pathlib.Path], Any], run_dir: pathlib.Path, name: str, reasons: list[str]) -> Any:
    try:
        payload = read(run_dir)
    except (OSError, ValueError) as error:
        reasons.append(f"unreadable {name} ({error})")
        return None
    if payload is None:
        reasons.append(f"no {name}")
    return payload


def identity_differences(meta: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """How ``meta.json`` disagrees with ``config.yaml``."""
    differences = []
    fingerprint = config_fingerprint(config)
    if meta.get("config_fingerprint") is None:
        differences.append("meta.json records no config_fingerprint, so config.yaml cannot be checked against the "
                           "config the run recorded")
    elif meta.get("config_fingerprint") != fingerprint:
        differences.append(f"config.yaml is not the config the run recorded (its fingerprint is {fingerprint}, "
                           f"meta.json records {meta.get('config_fingerprint')!r})")
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


def verify_run(run_dir: str | os.PathLike[str]) -> list[str]:
    """The reasons the run folder cannot be trusted, each naming the file or what disagrees; never raises."""
    run_dir = pathlib.Path(run_dir)
    if run_dir.is_symlink():
        return [f"the run folder is a symbolic link (to {os.readlink(run_dir)}), not the run's own folder"]
    if not run_dir.exists():
        return ["no run folder"]
    if not run_dir.is_dir():
        return ["the run folder is not a folder"]
    reasons: list[str] = []
    _read(read_status, run_dir, STATUS_FILE, reasons)
    meta = _read(read_meta, run_dir, META_FILE, reasons)
    config = _read(read_config, run_dir, CONFIG_FILE, reasons)
    if meta is not None and config is not None:
        reasons += identity_differences(meta, config)
    reasons += metrics_problems(run_dir)
    return reasons


def metrics_problems(run_dir: pathlib.Path) -> list[str]:
    """``metrics.parquet`` whose footer cannot be read (a cut or overwritten file) with no ``metrics.jsonl`` left to
    read instead, or a completed run with no metrics file at all."""
    parquet = run_dir / METRICS_PARQUET
    if parquet.is_file() and not (run_dir / METRICS_JSONL).is_file():
        try:
            pq.ParquetFile(parquet).close()
        except Exception as error:  # noqa: BLE001  (pyarrow raises ArrowInvalid, OSError, ...: all mean unreadable)
            return [f"unreadable {METRICS_PARQUET} ({type(error).__name__}: {error})"]
        return []
    if not parquet.is_file() and not (run_dir / METRICS_JSONL).is_file():
        try:
            completed = (read_status(run_dir) or {}).get("state") == COMPLETED
        except (OSError, ValueError):
            completed = False
        if completed:
            return [f"status.json says completed, but there is no {METRICS_PARQUET} or {METRICS_JSONL}"]
    return []

