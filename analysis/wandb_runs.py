"""W&B runs -> :class:`analysis.frames.SweepData`: a W&B run's identity and factors, the online loader
:func:`load_wandb` with its parquet cache, and offline runs (``<run>/wandb/offline-run-*/run-*.wandb``) through
:func:`load_wandb_offline`, identity and factors as for online runs."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from dataflex_rl.keys import ALPHA_KEY
from dataflex_rl.hashing import stable_hash
from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, PENDING, RUNNING
from dataflex_rl.tracking.wandb_file import history, read_run, run_files

from analysis.frames import (IDENTITY_COLUMNS, RunMetrics, SweepData, as_float, as_seed, axis_factors, build_long_table,
                             flatten_config, histogram_table, make_run_table, parquet_safe, pop_factors, wide_metrics,
                             write_parquet_atomic)

# Where each identity field may sit in a W&B run's flattened config (the W&B logger adds ``run_identity``), first
# match wins; the run name ``<sweep>-a<alpha>-s<seed>``, the group and the tags (mechanism, backend) are fallbacks.
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
# W&B's run states -> the run store's; W&B names running, pending and failed runs as the run store does
WANDB_STATES: dict[str, str] = {
    **{state: state for state in (RUNNING, PENDING, FAILED)}, "finished": COMPLETED, "crashed": FAILED,
    "killed": INTERRUPTED, "preempted": INTERRUPTED, "preempting": RUNNING,
}
_RUN_NAME_PATTERN = re.compile(r"-a(?P<alpha>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)-s(?P<seed>-?\d+)$")
DEFAULT_CACHE_DIR = Path(os.environ.get("DATAFLEX_CACHE_DIR", "~/.cache/dataflex-rl")).expanduser() / "wandb"
_CACHE_FILES = ("runs.parquet", "metrics.parquet", "histograms.parquet")
# Part of every cache folder's hash: raise it when the cached tables change, so a cache of another layout is never read.
_CACHE_FORMAT = 2


def wandb_identity(run: Any, flat_config: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`WANDB_IDENTITY_KEYS` fields of a W&B run (with ``name``, ``id``, ``group``, ``tags``)."""
    name = str(getattr(run, "name", None) or getattr(run, "id", ""))
    tags = [str(tag) for tag in (getattr(run, "tags", None) or [])]
    identity = {field_name: next((flat_config["config." + key] for key in config_keys
                                  if flat_config.get("config." + key) is not None), None)
                for field_name, config_keys in WANDB_IDENTITY_KEYS.items()}
    match = _RUN_NAME_PATTERN.search(name)
    fallbacks = {
        "alpha": float(match["alpha"]) if match else None, "seed": int(match["seed"]) if match else None,
        "sweep": getattr(run, "group", None) or (name[: match.start()] if match else None),
        "mechanism": tags[0] if tags else None, "backend": tags[1] if len(tags) > 1 else None, "run": name,
    }
    identity.update({key: value for key, value in fallbacks.items() if identity[key] is None})
    if identity["mechanism_label"] is None:
        identity["mechanism_label"] = identity["mechanism"]
    return identity


def wandb_run_row(run: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """A W&B run's run-table row without its state: identity, ``factors`` (``run_identity.axes``), ``config.*``."""
    user_config = {key: value for key, value in config.items() if not str(key).startswith("_")}
    flat = flatten_config(user_config)
    identity = wandb_identity(run, flat)
    run_identity = user_config.get("run_identity")
    return {
        **{key: identity[key] for key in ("sweep", "run", "backend", "mechanism", "mechanism_label")},
        "alpha": as_float(identity["alpha"]), "seed": as_seed(identity["seed"]),
        "git_commit": identity["git_commit"], "config_hash": identity["config_hash"],
        "factors": axis_factors(run_identity.get("axes")) if isinstance(run_identity, Mapping) else {},
        **flat,
    }


def history_tables(rows: Mapping[int, Mapping[str, Any]], metrics: Sequence[str] | None = None
                   ) -> tuple[RunMetrics, list[dict[str, Any]]]:
    """``{step: {key: value}}`` history -> (scalar metrics, histogram records ``{step, name, edges, counts}``)."""
    histograms = []
    for step in sorted(rows):
        row = rows[step]
        for key, value in row.items():
            if key.endswith("/_type") and value == "histogram":
                name = key[: -len("/_type")]
                histograms.append({"step": int(step), "name": name,
                                   "edges": np.asarray(row.get(f"{name}/bins", []), dtype=np.float64),
                                   "counts": np.asarray(row.get(f"{name}/values", []), dtype=np.float64)})
    return wide_metrics(rows, metrics), histograms


def _sweep_data(rows: list[dict[str, Any]], histories: Mapping[int, Mapping[int, Mapping[str, Any]]],
                metrics: Sequence[str] | None, source: str) -> SweepData:
    """The tables of W&B runs: ``rows`` (run-table rows), each with a history in ``histories`` included."""
    run_metrics, records = {}, []
    for position, history_rows in histories.items():
        row = rows[position]
        run_metrics[position], histograms = history_tables(history_rows, metrics)
        row["included"] = True
        if len(run_metrics[position].steps):
            row["status_step"] = int(run_metrics[position].steps[-1])
        labels = {**{column: row[column] for column in IDENTITY_COLUMNS}, **row.get("factors", {})}
        records += [{**labels, **record} for record in histograms]
    factors = pop_factors(rows)
    runs = make_run_table(rows, factors)
    return SweepData(runs=runs, metrics=build_long_table(runs, run_metrics),
                     histograms=histogram_table(records, factors), source=source)


def _online_history(run: Any, step_key: str, page_size: int) -> dict[int, dict[str, Any]]:
    """A W&B API run's history as ``{step: {key: value}}``, histograms flattened as the offline files hold them."""
    # no ``keys``: with keys scan_history returns only rows holding every key, losing metrics logged at other steps
    by_step: dict[int, dict[str, Any]] = {}
    for record in run.scan_history(page_size=page_size):
        if record.get(step_key) is None:
            continue
        row = by_step.setdefault(int(record[step_key]), {})
        for key, value in record.items():
            if key.startswith("_") or key == step_key:
                continue
            if isinstance(value, Mapping):
                if value.get("_type") == "histogram" and "bins" in value and "values" in value:
                    row.update({f"{key}/_type": "histogram", f"{key}/bins": value["bins"],
                                f"{key}/values": value["values"]})
            elif isinstance(value, (bool, int, float)):
                row[key] = float(value)
    return by_step


def _online_row(wandb_run: Any, entity: str, project: str) -> dict[str, Any]:
    row = wandb_run_row(wandb_run, dict(getattr(wandb_run, "config", None) or {}))
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


def load_wandb(entity: str, project: str, *, group: str | None = None, filters: Mapping[str, Any] | None = None,
               metrics: Sequence[str] | None = None, include_incomplete: bool = False,
               cache_dir: str | os.PathLike[str] | None = None, refresh: bool = False, step_key: str = "_step",
               page_size: int = 1000, api: Any = None) -> SweepData:
    """Runs logged online to ``entity/project`` (one ``group`` = one sweep) -> :class:`SweepData`, cached as parquet
    under ``cache_dir`` (default ``$DATAFLEX_CACHE_DIR/wandb``) by query; ``refresh=True`` downloads again."""
    query = {"filters": dict(filters or {}), "metrics": list(metrics) if metrics is not None else None,
             "step_key": step_key, "include_incomplete": include_incomplete, "format": _CACHE_FORMAT}
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{entity}__{project}__{group or 'all'}")
    folder = Path(cache_dir or DEFAULT_CACHE_DIR) / f"{safe}__{stable_hash(query, length=12)}"
    source = f"wandb:{entity}/{project}" + (f"?group={group}" if group else "")
    if not refresh and all((folder / name).is_file() for name in _CACHE_FILES):
        runs, metrics_table, histograms = (pd.read_parquet(folder / name) for name in _CACHE_FILES)
        for column in ("edges", "counts"):
            histograms[column] = [np.asarray(v, dtype=np.float64) for v in histograms[column]]
        return SweepData(runs=runs, metrics=metrics_table, histograms=histograms, source=source + f" (cache {folder})")
    if api is None:
        import wandb  # imported here: slow to import and only needed for online runs

        api = wandb.Api()
    rows, histories = [], {}  # every listed run; a failed history download excludes only that run
    for wandb_run in api.runs(f"{entity}/{project}", filters={**(filters or {}), **(
            {"group": group} if group is not None else {})} or None):
        rows.append(row := _online_row(wandb_run, entity, project))
        if row["state"] != COMPLETED and not include_incomplete:
            continue
        try:
            histories[len(rows) - 1] = _online_history(wandb_run, step_key, page_size)
        except Exception as exc:  # noqa: BLE001 - one run whose history fails must not lose the others
            row["included"] = False
            row["exclusion_reason"] = "; ".join(filter(None, [row["exclusion_reason"],
                                                              f"history download failed ({exc})"]))
    data = _sweep_data(rows, histories, metrics, source)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in zip(_CACHE_FILES, (parquet_safe(data.runs), data.metrics, data.histograms), strict=True):
        write_parquet_atomic(table, folder / name)
    return data


def offline_state(exit_code: int | None) -> str:
    """Run-store state of an offline run from its exit code (None: no exit record; 130, 143: SIGINT, SIGTERM)."""
    if exit_code is None:
        return RUNNING
    return COMPLETED if exit_code == 0 else INTERRUPTED if exit_code in (130, 143) else FAILED


def load_wandb_offline(root: str | os.PathLike[str], *, metrics: Sequence[str] | None = None,
                       include_incomplete: bool = False) -> SweepData:
    """Every offline W&B run file under ``root`` -> :class:`SweepData`, arguments as in ``load_sweep``."""
    rows, histories = [], {}
    for path in run_files(root):
        run = read_run(path)
        state = offline_state(run.exit_code)
        # the attributes wandb_identity reads from a W&B API run
        rows.append(row := wandb_run_row(SimpleNamespace(name=run.name, id=run.run_id, group=run.group,
                                                         tags=list(run.tags)), run.config))
        row.update({
            "state": state, "path": str(path), "metrics_source": "wandb",
            "included": state == COMPLETED or include_incomplete,
            "exclusion_reason": None if state == COMPLETED else f"state {state} (exit code {run.exit_code})",
        })
        if row["included"]:
            histories[len(rows) - 1] = history(path)
    return _sweep_data(rows, histories, metrics, f"wandb-offline:{Path(root)}")
