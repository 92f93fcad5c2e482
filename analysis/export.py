"""Sweep-level tables ``runs/<sweep>/metrics.parquet`` (long) and ``runs.parquet`` (runs), replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from analysis.frames import SweepData, factor_columns, parquet_safe, write_parquet_atomic
from analysis.load import load_sweep

METRICS_FILE = "metrics.parquet"
RUNS_FILE = "runs.parquet"


def long_table(data: SweepData) -> pd.DataFrame:
    """The long table with every swept factor as a column after ``alpha``."""
    factors = [c for c in factor_columns(data.runs) if c in data.metrics.columns]
    identity = [c for c in data.metrics.columns if c not in ("seed", "step", "metric", "value", *factors)]
    return data.metrics[[*identity, *factors, "seed", "step", "metric", "value"]].copy()


def write_sweep_tables(data: SweepData, sweep_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``metrics.parquet`` and ``runs.parquet`` of loaded sweep ``data`` into ``sweep_dir``; return the paths."""
    sweep_dir = Path(sweep_dir)
    if (sweep_dir / "meta.json").is_file():
        raise ValueError(f"{sweep_dir} is a run folder (it holds meta.json): its own metrics.parquet is the run "
                         "store's; sweep-level tables go into the sweep folder above it")
    paths = {"metrics": sweep_dir / METRICS_FILE, "runs": sweep_dir / RUNS_FILE}
    write_parquet_atomic(long_table(data), paths["metrics"])
    write_parquet_atomic(parquet_safe(data.runs), paths["runs"])
    return paths


def export_sweep(sweep_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Load the sweep folder and write its tables."""
    return write_sweep_tables(load_sweep(sweep_dir, histograms=False), sweep_dir)
