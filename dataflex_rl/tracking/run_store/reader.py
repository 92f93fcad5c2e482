"""The reader API: every other module reads a run folder through these calls. An unreadable file raises
``RunStoreError``; an absent one reads as None. An open run is read from its jsonl files, a closed one from parquet."""

from __future__ import annotations

import fnmatch
import numbers
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from dataflex_rl.tracking.run_store.files import (CONFIG_FILE, HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET, META_FILE,
                                                 METRICS_JSONL, METRICS_PARQUET, STATUS_FILE, SWEEP_FILE,
                                                 RunStoreError, read_json_object)
from dataflex_rl.tracking.run_store import schema
from dataflex_rl.tracking.run_store.logs import histograms_table, metrics_table, read_jsonl

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader parses a config ~10x faster


def is_run_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a run folder (it holds ``meta.json``, written when a run starts)."""
    return (pathlib.Path(path) / META_FILE).is_file()


def is_sweep_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sweep folder (it holds ``sweep.json``, the sweep driver's record of its runs)."""
    return (pathlib.Path(path) / SWEEP_FILE).is_file()


def run_record_files(path: str | os.PathLike[str]) -> list[str]:
    """The files at the top of ``path`` that only a run folder holds (``meta.json``, ``status.json``), those present."""
    return [name for name in (META_FILE, STATUS_FILE) if (pathlib.Path(path) / name).is_file()]


def _checked(path: pathlib.Path, file_schema: Any) -> dict[str, Any] | None:
    payload = read_json_object(path)
    return None if payload is None else schema.check_schema(path, payload, file_schema)


def read_status(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``status.json`` of a run: ``{"state", "step", "updated", "error", "traceback"}``; None before the run started."""
    return _checked(pathlib.Path(run_dir) / STATUS_FILE, schema.STATUS)


def read_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``meta.json`` of a run (identity, fingerprint, versions, host, times); None when absent."""
    return _checked(pathlib.Path(run_dir) / META_FILE, schema.META)


def read_sweep_record(sweep_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``sweep.json`` of a sweep folder (its grid, runs and invocations); None when absent."""
    return _checked(pathlib.Path(sweep_dir) / SWEEP_FILE, schema.SWEEP)


def read_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The resolved config of a run (``config.yaml``); None when absent."""
    path = pathlib.Path(run_dir) / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        config = yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader (CSafeLoader or SafeLoader)
    except yaml.YAMLError as error:
        raise RunStoreError(f"{path} is not valid YAML: {error}") from error
    if not isinstance(config, dict):
        raise RunStoreError(f"{path} holds a {type(config).__name__}, expected a mapping")
    return config


def metrics_source(run_dir: str | os.PathLike[str]) -> str | None:
    """Where a run's metrics are read from: ``"parquet"`` (closed run), ``"jsonl"`` (open or crashed), or None."""
    found = [source for source, name in (("parquet", METRICS_PARQUET), ("jsonl", METRICS_JSONL))
             if (pathlib.Path(run_dir) / name).is_file()]
    return found[0] if found else None


def read_metrics(run_dir: str | os.PathLike[str], keys: Sequence[str] | None = None, *, source: str | None = None,
                 skip_bad: bool = False) -> pd.DataFrame:
    """The metrics as a frame sorted by step (a key not logged at a step reads NaN: :func:`read_metrics_table` keeps
    "not logged" and "logged as NaN" apart)."""
    frame = read_metrics_table(run_dir, keys, source=source, skip_bad=skip_bad).to_pandas()
    if len(frame) > 1 and not frame["step"].is_monotonic_increasing:
        frame = frame.sort_values("step", kind="stable").drop_duplicates("step", keep="last")
    return frame.reset_index(drop=True)


def read_metrics_table(run_dir: str | os.PathLike[str], keys: Sequence[str] | None = None, *,
                       source: str | None = None, skip_bad: bool = False) -> pa.Table:
    """The metrics as an arrow table, a key not logged at a step null (``keys``: names or globs; ``source``:
    ``parquet``, ``jsonl`` or None for :func:`metrics_source`'s)."""
    run_dir = pathlib.Path(run_dir)
    source = source or metrics_source(run_dir)
    if source not in ("parquet", "jsonl", None):
        raise ValueError(f"source = {source!r} is not allowed: use 'parquet', 'jsonl' or None")
    if source is None:
        return pa.table({"step": pa.array([], type=pa.int64())})
    path = run_dir / (METRICS_PARQUET if source == "parquet" else METRICS_JSONL)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if source == "parquet":
        names = [name for name in pq.read_schema(path).names if name != "step"]
        return pq.read_table(path, columns=["step", *_select_keys(names, keys)])
    records = read_jsonl(path, skip_bad=skip_bad)
    wanted = set(_select_keys(sorted({key for record in records for key in record} - {"step"}), keys))
    # A value that is not a number (a hand-edited line) reads as not logged.
    return metrics_table([{"step": record["step"], **{
        key: float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
        for key, value in record.items() if key in wanted}} for record in records], source=str(path))


def _select_keys(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    """The names that are among ``patterns`` or match one of its globs (all when ``patterns`` is None)."""
    if patterns is None:
        return list(names)
    globs = [pattern for pattern in patterns if any(char in pattern for char in "*?[")]
    return [name for name in names if name in patterns or any(fnmatch.fnmatchcase(name, g) for g in globs)]


def read_curve(run_dir: str | os.PathLike[str], key: str, *, skip_bad: bool = False) -> pd.Series:
    """``step -> value`` of one metric at the steps where it was logged with a finite value, in step order."""
    frame = read_metrics(run_dir, [key], skip_bad=skip_bad)
    if key not in frame.columns:
        return pd.Series(dtype="float64", name=key, index=pd.Index([], dtype="int64", name="step"))
    curve = pd.Series(frame[key].to_numpy(dtype="float64"), index=pd.Index(frame["step"], name="step"), name=key)
    return curve[curve.notna() & (curve.abs() != float("inf"))]


def final_value(run_dir: str | os.PathLike[str], key: str, *, window: int = 1, skip_bad: bool = True) -> float | None:
    """The mean of the last ``window`` finite logged values of ``key``, or None (never logged)."""
    curve = read_curve(run_dir, key, skip_bad=skip_bad)
    return float(curve.iloc[-window:].mean()) if len(curve) else None


def load_histograms(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Histogram frame (``step, name, edges, counts``): ``histograms.parquet``, else ``histograms.jsonl``."""
    parquet, path = pathlib.Path(run_dir) / HISTOGRAMS_PARQUET, pathlib.Path(run_dir) / HISTOGRAMS_JSONL
    if parquet.exists():
        return pq.read_table(parquet).to_pandas()
    return histograms_table(read_jsonl(path), source=str(path)).to_pandas()

