"""Offline W&B runs (``<run>/wandb/offline-run-*/run-*.wandb``) -> :class:`analysis.load.SweepData`.

For runs whose run store is gone or was never written (a W&B-only logger setup, files copied from a cluster without
the rest): the same tables :func:`analysis.load.load_sweep` builds, read from the W&B files through
:mod:`dataflex_rl.tracking.wandb_offline`. Identity comes from the config's ``run_identity`` (the W&B logger stores
it), then the run name, group and tags, as for online runs. State: exit code 0 -> ``completed``, 130/143 ->
``interrupted``, other codes -> ``failed``, no exit record -> ``running``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import (
    COMPLETED,
    HISTOGRAM_COLUMNS,
    IDENTITY_COLUMNS,
    RunMetrics,
    SweepData,
    _as_float,
    _as_seed,
    _select_names,
    _wandb_identity,
    build_long_table,
    empty_histogram_table,
    flatten_config,
    make_run_table,
)
from dataflex_rl.tracking.wandb_offline import OfflineRun, history, read_run, run_files

INTERRUPTED_EXIT_CODES = (130, 143)


def offline_state(exit_code: int | None) -> str:
    """Run-store state of an offline run from its exit code (None: the file has no exit record)."""
    if exit_code is None:
        return "running"
    if exit_code == 0:
        return COMPLETED
    return "interrupted" if exit_code in INTERRUPTED_EXIT_CODES else "failed"


def history_tables(rows: Mapping[int, Mapping[str, Any]], metrics: Sequence[str] | None = None
                   ) -> tuple[RunMetrics, list[dict[str, Any]]]:
    """``{step: {key: value}}`` history -> (scalar metrics, histogram records ``{step, name, edges, counts}``)."""
    steps = np.array(sorted(rows), dtype=np.int64)
    scalar_names = sorted({key for row in rows.values() for key, value in row.items()
                           if isinstance(value, (int, float)) and not isinstance(value, bool)})
    names = tuple(_select_names(scalar_names, metrics))
    index = {name: i for i, name in enumerate(names)}
    values = np.full((len(names), len(steps)), np.nan)
    histograms = []
    for column, step in enumerate(steps):
        row = rows[int(step)]
        for key, value in row.items():
            if key in index and isinstance(value, (int, float)) and not isinstance(value, bool):
                values[index[key], column] = float(value)
            if key.endswith("/_type") and value == "histogram":
                name = key[: -len("/_type")]
                histograms.append({"step": int(step), "name": name,
                                   "edges": np.asarray(row.get(f"{name}/bins", []), dtype=np.float64),
                                   "counts": np.asarray(row.get(f"{name}/values", []), dtype=np.float64)})
    return RunMetrics(steps, names, values), histograms


class _RunView:
    """The attributes :func:`analysis.load._wandb_identity` reads from a W&B API run, for an offline run."""

    def __init__(self, run: OfflineRun) -> None:
        self.name, self.id, self.group, self.tags = run.name, run.run_id, run.group, list(run.tags)


def load_wandb_offline(
    root: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
    known_backends: Sequence[str] = ("local", "verl"),
) -> SweepData:
    """Every offline W&B run file under ``root`` (a sweep folder, a run folder or any folder above them).

    ``metrics``: keys or ``fnmatch`` globs to load (default all); ``include_incomplete``: also load runs that did not
    exit with code 0 (they stay flagged by ``state``).
    """
    rows: list[dict[str, Any]] = []
    run_metrics: dict[int, RunMetrics] = {}
    histogram_records: list[dict[str, Any]] = []
    for path in run_files(root):
        run = read_run(path)
        flat = flatten_config({k: v for k, v in run.config.items() if not str(k).startswith("_")})
        identity = _wandb_identity(_RunView(run), flat, known_backends)
        state = offline_state(run.exit_code)
        included = state == COMPLETED or include_incomplete
        row: dict[str, Any] = {
            **{k: identity[k] for k in ("sweep", "run", "backend", "mechanism", "mechanism_label")},
            "alpha": _as_float(identity["alpha"]), "seed": _as_seed(identity["seed"]), "state": state,
            "git_commit": identity["git_commit"], "config_hash": identity["config_hash"], "path": str(path),
            "metrics_source": "wandb", "included": included,
            "exclusion_reason": None if state == COMPLETED else f"state {state} (exit code {run.exit_code})",
            **flat,
        }
        if included:
            run_metrics[len(rows)], records = history_tables(history(path), metrics)
            if len(run_metrics[len(rows)].steps):
                row["status_step"] = int(run_metrics[len(rows)].steps[-1])
            histogram_records += [{**{c: row[c] for c in IDENTITY_COLUMNS}, **r} for r in records]
        rows.append(row)
    runs = make_run_table(rows)
    histograms = (pd.DataFrame.from_records(histogram_records, columns=list(HISTOGRAM_COLUMNS))
                  if histogram_records else empty_histogram_table())
    histograms["seed"] = histograms["seed"].astype("Int64")
    return SweepData(runs=runs, metrics=build_long_table(runs, run_metrics), histograms=histograms,
                     source=f"wandb-offline:{Path(root)}")
