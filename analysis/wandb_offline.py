"""Offline W&B runs (``<run>/wandb/offline-run-*/run-*.wandb``) -> :class:`analysis.frames.SweepData`.

For runs whose run store is gone or was never written (a W&B-only logger setup, files copied from a cluster without
the rest): the same tables :func:`analysis.load.load_sweep` builds, read from the W&B files through
:mod:`dataflex_rl.tracking.wandb_offline`. Identity and factor columns come from the config's ``run_identity`` (the
W&B logger stores it; its ``axes`` are the sweep's factors), then the run name, group and tags, as for online runs
(:func:`analysis.wandb_runs.wandb_run_row`). State: exit code 0 -> ``completed``, 130/143 -> ``interrupted``, other
codes -> ``failed``, no exit record -> ``running``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.frames import COMPLETED, RunMetrics, SweepData, select_names
from analysis.wandb_runs import WandbTables, wandb_run_row
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
    names = tuple(select_names(scalar_names, metrics))
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
    """The attributes :func:`analysis.wandb_runs.wandb_identity` reads from a W&B API run, for an offline run."""

    def __init__(self, run: OfflineRun) -> None:
        self.name, self.id, self.group, self.tags = run.name, run.run_id, run.group, list(run.tags)


def _offline_row(path: Path, run: OfflineRun, known_backends: Sequence[str], include_incomplete: bool
                 ) -> dict[str, Any]:
    """An offline run file's run-table row: :func:`analysis.wandb_runs.wandb_run_row` plus state (from the exit
    code), path and whether it is to be included."""
    state = offline_state(run.exit_code)
    row = wandb_run_row(_RunView(run), run.config, known_backends)
    row.update({
        "state": state, "path": str(path), "metrics_source": "wandb",
        "included": state == COMPLETED or include_incomplete,
        "exclusion_reason": None if state == COMPLETED else f"state {state} (exit code {run.exit_code})",
    })
    return row


def load_wandb_offline(
    root: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
    known_backends: Sequence[str] = ("local", "verl"),
) -> SweepData:
    """Every offline W&B run file under ``root`` (a sweep folder, a run folder or any folder above them).

    ``metrics``: keys or ``fnmatch`` globs to load (default all); ``include_incomplete``: also load runs that did not
    exit with code 0 (they stay flagged by ``state``). The runs' recorded axes become factor columns, as in
    :func:`analysis.load.load_sweep`; a run without recorded axes (outside a grid) has alpha and seed only.
    """
    tables = WandbTables()
    for path in run_files(root):
        run = read_run(path)
        row = _offline_row(path, run, known_backends, include_incomplete)
        position = tables.add(row)
        if row["included"]:
            tables.add_metrics(position, *history_tables(history(path), metrics))
    return tables.sweep_data(f"wandb-offline:{Path(root)}")
