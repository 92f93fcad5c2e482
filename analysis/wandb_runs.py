"""W&B runs -> :class:`analysis.frames.SweepData`: the identity of a W&B run and the online loader with its cache.

A W&B run's identity comes from its config: the W&B logger (:mod:`dataflex_rl.tracking.wandb_logger`) stores the
resolved config plus ``run_identity`` (the :class:`~dataflex_rl.tracking.identity.RunIdentity` fields, ``meta.json``'s
identity). ``run_identity.axes`` (``{factor: value}`` of every axis of the sweep's grid) becomes the same factor
columns :func:`analysis.load.load_sweep` builds from ``meta.json`` (``eta``, ``trainer.lr``, ...), so a frame loaded
from W&B groups by any factor like one loaded from run stores. A run outside a grid has no axes: alpha and seed only,
from ``run_identity``, else (a verl run started without ``dataflex_run``, which logs no ``run_identity``) from the
config's ``dataflex`` keys, the run name ``<sweep>-a<alpha>-s<seed>``, the group and the tags.

:func:`load_wandb` reads runs logged online through ``wandb.Api()``; :mod:`analysis.wandb_offline` reads offline run
files with the same identity and row rules (:func:`wandb_run_row`, :class:`WandbTables`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dataflex_rl.keys import ALPHA_KEY

from analysis.frames import (
    COMPLETED,
    IDENTITY_COLUMNS,
    RunMetrics,
    SweepData,
    as_float,
    as_seed,
    axis_factors,
    build_long_table,
    flatten_config,
    histogram_table,
    make_run_table,
    parquet_safe,
    pop_factors,
    select_names,
    write_parquet_atomic,
)

# Where each identity field may sit in a W&B run's flattened config, first match wins: the W&B logger adds
# ``run_identity`` (the meta.json identity) to the resolved config. The run name ``<sweep>-a<alpha>-s<seed>``, the
# group and the tags (mechanism, backend) are the fallbacks.
WANDB_IDENTITY_KEYS: dict[str, tuple[str, ...]] = {
    "sweep": ("run_identity.sweep", "sweep"),
    "run": ("run_identity.run",),
    "backend": ("run_identity.backend", "backend"),
    "mechanism": ("run_identity.mechanism", "dataflex.mechanism", "mechanism"),
    "mechanism_label": ("run_identity.mechanism_label", "mechanism_label", "dataflex.mechanism_label"),
    "alpha": ("run_identity.alpha", "alpha", ALPHA_KEY),
    "seed": ("run_identity.seed", "seed"),
    "git_commit": ("run_identity.git_commit", "git_commit"),
    "config_hash": ("run_identity.config_hash", "config_hash"),
}
# The key of the recorded axes inside the config's ``run_identity`` (``RunIdentity.to_dict``).
AXES_KEY = "axes"
WANDB_STATES: dict[str, str] = {
    "finished": "completed", "running": "running", "pending": "pending", "crashed": "failed", "failed": "failed",
    "killed": "interrupted", "preempted": "interrupted", "preempting": "running",
}
_RUN_NAME_PATTERN = re.compile(r"-a(?P<alpha>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)-s(?P<seed>-?\d+)$")
DEFAULT_CACHE_DIR = Path(os.environ.get("DATAFLEX_CACHE_DIR", "~/.cache/dataflex-rl")).expanduser() / "wandb"
_CACHE_FILES = ("runs.parquet", "metrics.parquet", "histograms.parquet")
# Part of every cache folder's hash: raise it when the cached tables change, so a cache of another layout is never read.
_CACHE_FORMAT = 2


# --- identity ----------------------------------------------------------------------------------------------------


def wandb_identity(run: Any, flat_config: Mapping[str, Any], known_backends: Sequence[str]) -> dict[str, Any]:
    """The :data:`WANDB_IDENTITY_KEYS` fields of a W&B run (``run``: anything with ``name``, ``id``, ``group`` and
    ``tags``, as ``wandb.Api`` runs have), from ``flat_config`` (:func:`flatten_config`), else the run name
    ``<sweep>-a<alpha>-s<seed>``, the group, and the tags (a tag in ``known_backends`` is the backend, another the
    mechanism)."""

    def lookup(field_name: str) -> Any:
        for key in WANDB_IDENTITY_KEYS[field_name]:
            value = flat_config.get("config." + key)
            if value is not None:
                return value
        return None

    name = str(getattr(run, "name", None) or getattr(run, "id", ""))
    tags = [str(tag) for tag in (getattr(run, "tags", None) or [])]
    identity = {field_name: lookup(field_name) for field_name in WANDB_IDENTITY_KEYS}
    match = _RUN_NAME_PATTERN.search(name)
    if identity["alpha"] is None and match:
        identity["alpha"] = float(match["alpha"])
    if identity["seed"] is None and match:
        identity["seed"] = int(match["seed"])
    if identity["sweep"] is None:
        identity["sweep"] = getattr(run, "group", None) or (name[: match.start()] if match else None)
    if identity["backend"] is None:
        identity["backend"] = next((tag for tag in tags if tag in known_backends), None)
    if identity["mechanism"] is None:
        identity["mechanism"] = next((tag for tag in tags if tag not in known_backends), None)
    if identity["mechanism_label"] is None:
        identity["mechanism_label"] = identity["mechanism"]
    if identity["run"] is None:
        identity["run"] = name
    return identity


def recorded_factors(config: Mapping[str, Any]) -> dict[str, Any]:
    """The factor columns of a W&B run: its config's ``run_identity.axes`` without alpha, seed and the preset label
    (their identity columns hold them); ``{}`` for a run outside a grid."""
    run_identity = config.get("run_identity")
    return axis_factors(run_identity.get(AXES_KEY)) if isinstance(run_identity, Mapping) else {}


def wandb_run_row(run: Any, config: Mapping[str, Any], known_backends: Sequence[str]) -> dict[str, Any]:
    """The identity part of a W&B run's run-table row: identity columns, ``git_commit``, ``config_hash``, its
    ``factors`` (:func:`recorded_factors`, for :func:`analysis.frames.pop_factors`) and the config flattened to
    ``config.*`` columns (W&B's own ``_``-keys left out)."""
    user_config = {key: value for key, value in config.items() if not str(key).startswith("_")}
    flat = flatten_config(user_config)
    identity = wandb_identity(run, flat, known_backends)
    return {
        **{key: identity[key] for key in ("sweep", "run", "backend", "mechanism", "mechanism_label")},
        "alpha": as_float(identity["alpha"]), "seed": as_seed(identity["seed"]),
        "git_commit": identity["git_commit"], "config_hash": identity["config_hash"],
        "factors": recorded_factors(user_config),
        **flat,
    }


@dataclass
class WandbTables:
    """Run-table rows, their metrics and histogram records gathered run by run, then turned into
    :class:`SweepData` (:meth:`sweep_data`): what the online and the offline W&B loaders share."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    run_metrics: dict[int, RunMetrics] = field(default_factory=dict)
    histogram_records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> int:
        """Add a run's row (with its ``factors``); return its position in the run table."""
        self.rows.append(row)
        return len(self.rows) - 1

    def add_metrics(self, position: int, metrics: RunMetrics, histograms: Sequence[Mapping[str, Any]]) -> None:
        """Attach a run's metrics and histogram records (``step, name, edges, counts``); its row is included and
        its ``status_step`` is the last step logged."""
        row = self.rows[position]
        self.run_metrics[position] = metrics
        row["included"] = True
        if len(metrics.steps):
            row["status_step"] = int(metrics.steps[-1])
        labels = {**{column: row[column] for column in IDENTITY_COLUMNS}, **row.get("factors", {})}
        self.histogram_records += [{**labels, **record} for record in histograms]

    def sweep_data(self, source: str) -> SweepData:
        """The run table, long table and histogram table of the runs added (factors as columns)."""
        factors = pop_factors(self.rows)
        runs = make_run_table(self.rows, factors)
        return SweepData(runs=runs, metrics=build_long_table(runs, self.run_metrics),
                         histograms=histogram_table(self.histogram_records, factors), source=source)


# --- online ------------------------------------------------------------------------------------------------------


def _wandb_rows(
    run: Any, step_key: str, metrics: Sequence[str] | None, page_size: int
) -> tuple[RunMetrics, list[dict[str, Any]]]:
    """All history rows of one W&B run -> (scalar metrics, histogram records).

    ``scan_history`` is called without ``keys``: with keys it returns only rows holding every key, which loses metrics
    logged at different steps. Keys starting with ``_`` (W&B's own) are dropped; a value ``{"_type": "histogram",
    "bins": edges, "values": counts}`` becomes a histogram record.
    """
    by_step: dict[int, dict[str, float]] = {}
    histograms: list[dict[str, Any]] = []
    for record in run.scan_history(page_size=page_size):
        step_value = record.get(step_key)
        if step_value is None:
            continue
        step = int(step_value)
        row = by_step.setdefault(step, {})
        for key, value in record.items():
            if key.startswith("_") or key == step_key:
                continue
            if isinstance(value, Mapping):
                if value.get("_type") == "histogram" and "bins" in value and "values" in value:
                    histograms.append({"step": step, "name": key, "edges": np.asarray(value["bins"], np.float64),
                                       "counts": np.asarray(value["values"], np.float64)})
                continue
            if isinstance(value, (bool, int, float)):
                row[key] = float(value)
    steps = np.array(sorted(by_step), dtype=np.int64)
    names = tuple(select_names(sorted({k for row in by_step.values() for k in row}), metrics))
    values = np.full((len(names), len(steps)), np.nan)
    index = {name: i for i, name in enumerate(names)}
    for column, step in enumerate(steps):
        for key, value in by_step[int(step)].items():
            if key in index:
                values[index[key], column] = value
    return RunMetrics(steps, names, values), histograms


def _online_row(wandb_run: Any, entity: str, project: str, known_backends: Sequence[str]) -> dict[str, Any]:
    """A ``wandb.Api`` run's run-table row: :func:`wandb_run_row` plus state (:data:`WANDB_STATES`), run time,
    creation time and the ``wandb:<entity>/<project>/<id>`` path."""
    row = wandb_run_row(wandb_run, dict(getattr(wandb_run, "config", None) or {}), known_backends)
    raw_state = str(getattr(wandb_run, "state", "unknown")).lower()
    state = WANDB_STATES.get(raw_state, raw_state)
    summary = getattr(wandb_run, "summary", None) or {}
    row.update({
        "state": state, "status_step": None, "error": None,
        "wall_time_s": as_float(summary.get("_runtime") if hasattr(summary, "get") else None),
        "start_time": getattr(wandb_run, "created_at", None), "end_time": None,
        "path": f"wandb:{entity}/{project}/{getattr(wandb_run, 'id', row['run'])}", "metrics_source": "wandb",
        "included": state == COMPLETED,
        "exclusion_reason": None if state == COMPLETED else f"state {state} (W&B state {raw_state})",
    })
    return row


def _cache_folder(cache_dir: Path, entity: str, project: str, group: str | None, query: Mapping[str, Any]) -> Path:
    """``<cache_dir>/<entity>__<project>__<group>__<first 12 hex digits of sha256 of the query>``."""
    digest = hashlib.sha256(json.dumps(query, sort_keys=True, default=str).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{entity}__{project}__{group or 'all'}")
    return cache_dir / f"{safe}__{digest}"


def _read_cache(folder: Path, source: str) -> SweepData | None:
    """The tables cached in ``folder``, or None unless all three files are there."""
    if not all((folder / name).is_file() for name in _CACHE_FILES):
        return None
    runs = pd.read_parquet(folder / "runs.parquet")
    histograms = pd.read_parquet(folder / "histograms.parquet")
    for column in ("edges", "counts"):
        histograms[column] = [np.asarray(v, dtype=np.float64) for v in histograms[column]]
    return SweepData(runs=runs, metrics=pd.read_parquet(folder / "metrics.parquet"), histograms=histograms,
                     source=source + f" (cache {folder})")


def _write_cache(data: SweepData, folder: Path) -> None:
    """Write the three tables of ``data`` into ``folder`` (each atomically)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(parquet_safe(data.runs), folder / "runs.parquet")
    write_parquet_atomic(data.metrics, folder / "metrics.parquet")
    write_parquet_atomic(data.histograms, folder / "histograms.parquet")


def _download(api: Any, path: str, run_filters: Mapping[str, Any], *, entity: str, project: str,
              options: Mapping[str, Any]) -> WandbTables:
    """Every run ``api.runs(path, filters)`` lists, with the history of those to be included; a run whose history
    download fails is excluded with the reason, the others still load."""
    tables = WandbTables()
    for wandb_run in api.runs(path, filters=dict(run_filters) or None):
        row = _online_row(wandb_run, entity, project, options["known_backends"])
        position = tables.add(row)
        if row["state"] != COMPLETED and not options["include_incomplete"]:
            continue
        try:
            metrics, records = _wandb_rows(wandb_run, options["step_key"], options["metrics"], options["page_size"])
        except Exception as exc:  # noqa: BLE001 - one run whose history fails must not lose the others
            row["included"] = False
            row["exclusion_reason"] = "; ".join(filter(None, [row["exclusion_reason"],
                                                              f"history download failed ({exc})"]))
            continue
        tables.add_metrics(position, metrics, records)
    return tables


def load_wandb(
    entity: str,
    project: str,
    *,
    group: str | None = None,
    filters: Mapping[str, Any] | None = None,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    refresh: bool = False,
    step_key: str = "_step",
    known_backends: Sequence[str] = ("local", "verl"),
    page_size: int = 1000,
    api: Any = None,
) -> SweepData:
    """Load runs logged online to W&B (``entity/project``, optionally one ``group`` = one sweep) into
    :class:`SweepData`, through ``wandb.Api()``; the result is cached as parquet so a second call needs no network.

    Identity comes from the run config (:data:`WANDB_IDENTITY_KEYS`: the ``run_identity`` the W&B logger stores), then
    the run name ``<sweep>-a<alpha>-s<seed>``, the group and the tags; the recorded axes
    (``run_identity.axes``) become factor columns as in :func:`analysis.load.load_sweep`. W&B states map to
    run-store states by :data:`WANDB_STATES` (``finished`` -> ``completed``, ``crashed`` -> ``failed``, ``killed`` ->
    ``interrupted``). ``step_key``: the history key holding the training step.

    Cache: ``<cache_dir>/<entity>__<project>__<group>__<hash of the query>/`` holding ``runs.parquet``,
    ``metrics.parquet`` and ``histograms.parquet``, written once the whole download succeeded. The cache is never
    refreshed on its own (a sweep still running needs ``refresh=True``). ``cache_dir`` default:
    ``$DATAFLEX_CACHE_DIR/wandb`` (``~/.cache/dataflex-rl/wandb``).
    """
    query = {"filters": dict(filters or {}), "metrics": list(metrics) if metrics is not None else None,
             "step_key": step_key, "include_incomplete": include_incomplete, "format": _CACHE_FORMAT}
    folder = _cache_folder(Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR, entity, project, group,
                           query)
    source = f"wandb:{entity}/{project}" + (f"?group={group}" if group else "")
    cached = None if refresh else _read_cache(folder, source)
    if cached is not None:
        return cached
    if api is None:
        import wandb  # imported here: slow to import and only needed for online runs

        api = wandb.Api()
    run_filters = {**(filters or {}), **({"group": group} if group is not None else {})}
    options = {"known_backends": known_backends, "include_incomplete": include_incomplete, "step_key": step_key,
               "metrics": metrics, "page_size": page_size}
    data = _download(api, f"{entity}/{project}", run_filters, entity=entity, project=project,
                     options=options).sweep_data(source)
    _write_cache(data, folder)
    return data
