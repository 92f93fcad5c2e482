"""Offline W&B runs (``<run>/wandb/offline-run-*/run-*.wandb``) -> the tables :func:`analysis.load.load_sweep`
builds, identity and factors as for online runs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from analysis.frames import RunMetrics, SweepData, wide_metrics
from analysis.wandb_runs import WandbTables, wandb_run_row
from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, RUNNING
from dataflex_rl.tracking.wandb_offline import history, read_run, run_files

INTERRUPTED_EXIT_CODES = (130, 143)


def offline_state(exit_code: int | None) -> str:
    """Run-store state of an offline run from its exit code (None: no exit record)."""
    if exit_code is None:
        return RUNNING
    if exit_code == 0:
        return COMPLETED
    return INTERRUPTED if exit_code in INTERRUPTED_EXIT_CODES else FAILED


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


def load_wandb_offline(
    root: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
) -> SweepData:
    """Every offline W&B run file under ``root`` -> :class:`SweepData`, arguments as in ``load_sweep``."""
    tables = WandbTables()
    for path in run_files(root):
        run = read_run(path)
        state = offline_state(run.exit_code)
        # the attributes wandb_identity reads from a W&B API run
        view = SimpleNamespace(name=run.name, id=run.run_id, group=run.group, tags=list(run.tags))
        row = wandb_run_row(view, run.config)
        row.update({
            "state": state, "path": str(path), "metrics_source": "wandb",
            "included": state == COMPLETED or include_incomplete,
            "exclusion_reason": None if state == COMPLETED else f"state {state} (exit code {run.exit_code})",
        })
        position = tables.add(row)
        if row["included"]:
            tables.add_metrics(position, *history_tables(history(path), metrics))
    return tables.sweep_data(f"wandb-offline:{Path(root)}")
