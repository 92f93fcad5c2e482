"""Run store (or W&B) -> one long metrics table plus a run table.

Long table (:attr:`SweepData.metrics`), one row per logged ``(run, metric, step)`` with a finite value, ordered by run
(run-table order), then metric (alphabetical), then step:

    sweep, run, backend, mechanism, mechanism_label (category) | alpha (float64) | seed (Int64) |
    step (int64) | metric (category) | value (float64)

``mechanism_label`` names the mechanism configuration (``baseline``, ``ar``, ``lopti``, ...) when ``meta.json`` carries
one, else it repeats ``mechanism``; analysis treats it as a factor beside ``alpha``.

Every other swept factor is a column too, between ``alpha`` and ``seed`` (``eta``, ``trainer.lr``, ``task``, ...): its
name and value come from ``meta.json``'s ``axes`` (the grid's axes, values read from the run's resolved config); for
a store written before runs recorded their axes, from the axes ``sweep.json``'s grid names, read from each run's
config. A store with neither (alpha and seed only) has no factor columns. :func:`factor_columns` lists them.

Run table (:attr:`SweepData.runs`), one row per run folder (plus one per ``sweep.json`` entry without a folder):
identity columns as above, then ``state``, ``status_step``, ``error``, ``wall_time_s``, ``git_commit``,
``config_hash``, ``start_time``, ``end_time``, ``path``, ``metrics_source`` (``parquet``, ``jsonl``, ``wandb`` or
``none``), ``included`` (bool: its metrics are in the long table), ``exclusion_reason``, the factor columns and the
resolved config flattened to ``config.<dotted.key>`` columns (lists and mappings as JSON text).

A run whose ``status.json`` state is not ``completed`` is excluded (its metrics are not loaded) unless
``include_incomplete=True``; a run whose files cannot be read is always excluded. Nothing raises for one bad run.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dataflex_rl.tracking import run_store

logger = logging.getLogger(__name__)

IDENTITY_COLUMNS: tuple[str, ...] = ("sweep", "run", "backend", "mechanism", "mechanism_label", "alpha", "seed")
CATEGORY_COLUMNS: tuple[str, ...] = ("sweep", "run", "backend", "mechanism", "mechanism_label")
LONG_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS, "step", "metric", "value")
HISTOGRAM_COLUMNS: tuple[str, ...] = (*IDENTITY_COLUMNS, "step", "name", "edges", "counts")
RUN_COLUMNS: tuple[str, ...] = (
    *IDENTITY_COLUMNS, "state", "status_step", "error", "wall_time_s", "git_commit", "config_hash", "start_time",
    "end_time", "path", "metrics_source", "included", "exclusion_reason",
)
COMPLETED = run_store.COMPLETED
RUN_STATES: tuple[str, ...] = run_store.STATES
# Folders inside a run or sweep folder that never hold run folders.
_SKIPPED_FOLDERS = frozenset({"checkpoints", "wandb", "report", "__pycache__", ".git"})
SWEEP_DIR_ENV = "DATAFLEX_SWEEP_DIR"
ETA_CONFIG_KEY = "dataflex.actuator.params.eta"

class NoRunStoreError(FileNotFoundError):
    """A folder given as a sweep holds no run store."""


@dataclass(frozen=True)
class SweepData:
    """What a loader returns: the run table, the long metrics table and the histogram table (see module doc)."""

    runs: pd.DataFrame
    metrics: pd.DataFrame
    histograms: pd.DataFrame
    manifest: dict[str, Any] | None = None
    source: str = ""

    @property
    def included_runs(self) -> pd.DataFrame:
        """Run-table rows whose metrics are in :attr:`metrics`."""
        return self.runs[self.runs["included"]]

    @property
    def excluded_runs(self) -> pd.DataFrame:
        """Run-table rows left out of :attr:`metrics`, with ``state``, ``error`` and ``exclusion_reason``."""
        return self.runs[~self.runs["included"]]

    @property
    def metric_names(self) -> list[str]:
        """Metric keys present in :attr:`metrics` (sorted)."""
        return sorted(self.metrics["metric"].unique().tolist()) if len(self.metrics) else []


@dataclass(frozen=True)
class RunMetrics:
    """One run's metrics in wide form: ``steps`` ``(n,)`` int64 sorted unique, ``values`` ``(m, n)`` float64."""

    steps: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray


# --- small readers -----------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    with open(path) as handle:
        payload = json.load(handle)
    if not isinstance(payload, dict):
        # ValueError, not TypeError: the file's content is wrong, and callers treat it like any unreadable file
        raise ValueError(f"{path} holds a {type(payload).__name__}, expected a JSON object")  # noqa: TRY004
    return payload


def flatten_config(config: Mapping[str, Any], prefix: str = "config.") -> dict[str, Any]:
    """Nested mapping -> ``{prefix + "a.b.c": value}``; lists and empty mappings become JSON text."""
    flat: dict[str, Any] = {}

    def visit(node: Any, path: str) -> None:
        if isinstance(node, Mapping) and node:
            for key, child in node.items():
                visit(child, f"{path}.{key}" if path else str(key))
        elif isinstance(node, (list, tuple, Mapping)):
            flat[prefix + path] = json.dumps(node, default=str)
        else:
            flat[prefix + path] = node

    visit(config, "")
    return flat


def _first_line(text: Any) -> str | None:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else None


def _as_float(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _as_seed(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _select_names(names: Iterable[str], patterns: Sequence[str] | None) -> list[str]:
    """Names matching any of ``patterns`` (exact keys or ``fnmatch`` globs such as ``grad_norm/by_prob/*``)."""
    names = list(names)
    if patterns is None:
        return names
    return [name for name in names if any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)]


def _run_metrics(frame: pd.DataFrame) -> RunMetrics:
    """A wide frame from :func:`run_store.read_metrics` -> :class:`RunMetrics` (non-numeric columns skipped)."""
    names = tuple(c for c in frame.columns if c != "step" and pd.api.types.is_numeric_dtype(frame[c]))
    values = np.empty((len(names), len(frame)), dtype=np.float64)
    for row, name in enumerate(names):
        values[row] = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
    return _sorted_unique(frame["step"].to_numpy(dtype=np.int64), names, values)


def read_run_metrics(run_dir: str | os.PathLike[str], metrics: Sequence[str] | None = None,
                     source: str | None = None) -> RunMetrics:
    """A run's metrics through the run store's reader (``metrics.parquet``, else ``metrics.jsonl``; ``source``
    forces one); ``metrics``: keys or ``fnmatch`` globs. Corrupt jsonl lines are skipped with a warning."""
    return _run_metrics(run_store.read_metrics(run_dir, metrics, source=source, skip_bad=True))


def read_metrics_parquet(path: str | os.PathLike[str], metrics: Sequence[str] | None = None) -> RunMetrics:
    """A run's ``metrics.parquet`` (``path`` names the file; read by the run store's reader)."""
    return read_run_metrics(Path(path).parent, metrics, source="parquet")


def read_metrics_jsonl(path: str | os.PathLike[str], metrics: Sequence[str] | None = None) -> RunMetrics:
    """A run's ``metrics.jsonl`` (``path`` names the file): a line that is not a record is skipped with a warning, a
    repeated step keeps its last value of each key, a value that is not a number reads as missing."""
    return read_run_metrics(Path(path).parent, metrics, source="jsonl")


def _sorted_unique(steps: np.ndarray, names: tuple[str, ...], values: np.ndarray) -> RunMetrics:
    """Sort by step and keep the last row of a repeated step (the file format promises both; be safe)."""
    if len(steps) > 1 and not np.all(np.diff(steps) > 0):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[:, order]
        keep = np.append(steps[1:] != steps[:-1], True)
        steps, values = steps[keep], values[:, keep]
    return RunMetrics(steps, names, values)


# --- finding and describing runs ---------------------------------------------------------------------------------


def find_run_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders (folders holding ``meta.json``) under ``root``, sorted by path; ``root`` itself if it is one.

    The search does not descend into a run folder, nor into ``checkpoints``, ``wandb`` or ``report`` folders.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"sweep folder {str(root)!r} does not exist")
    if run_store.is_run_store(root):
        return [root]
    found: list[Path] = []
    for current, folders, files in os.walk(root):
        if run_store.META_FILE in files and Path(current) != root:
            found.append(Path(current))
            folders.clear()
            continue
        folders[:] = sorted(f for f in folders if f not in _SKIPPED_FOLDERS and not f.startswith("."))
    return sorted(found)


def read_manifest(sweep_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``sweep.json`` of a sweep folder, or None when absent or unreadable (it is optional extra information)."""
    path = Path(sweep_dir) / "sweep.json"
    if not path.is_file():
        return None
    try:
        return _read_json(path)
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable %s: %s", path, exc)
        return None


def _manifest_entries(manifest: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not manifest or not isinstance(manifest.get("runs"), list):
        return {}
    return {str(e["run"]): dict(e) for e in manifest["runs"] if isinstance(e, Mapping) and "run" in e}


def describe_run(
    run_dir: str | os.PathLike[str], manifest_entries: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """One run-table row (see module doc) from a run folder's ``meta.json``, ``status.json`` and ``config.yaml``.

    ``included`` is True when the run completed and has a metrics file; the loaders may still flip it. ``loadable``
    (dropped by the loaders) says whether the files can be read whatever the state. ``manifest_entries``:
    ``sweep.json`` entries by run name, filling identity fields ``meta.json`` lacks. Never raises for a damaged folder: the problem goes into ``exclusion_reason``.
    """
    run_dir = Path(run_dir)
    entries = manifest_entries or {}
    problems: list[str] = []
    meta: dict[str, Any] = {}
    try:
        meta = run_store.read_meta(run_dir) or {}
        if not meta:
            problems.append("no meta.json")
    except (OSError, ValueError) as exc:
        problems.append(f"unreadable meta.json ({exc})")
    meta_readable = not problems
    # sweep.json names runs by run name; the folder is normally named the same
    entry = dict(entries.get(str(meta.get("run")), entries.get(run_dir.name, {})))
    status: dict[str, Any] = {}
    try:
        status = run_store.read_status(run_dir) or {}
        if not status:
            problems.append("no status.json")
    except (OSError, ValueError) as exc:
        problems.append(f"unreadable status.json ({exc})")
    config: dict[str, Any] = {}
    try:
        config = run_store.read_config(run_dir) or {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable config: %s", exc)

    def identity(key: str, *fallbacks: Any) -> Any:
        """First non-null of meta.json, the sweep.json entry, then ``fallbacks``."""
        return next((value for value in (meta.get(key), entry.get(key), *fallbacks) if value is not None), None)

    mechanism = identity("mechanism")
    state = status.get("state") or entry.get("state") or "unknown"
    source = run_store.metrics_source(run_dir) or "none"
    # A run is loadable when its files can be read; only its state may still keep it out of the aggregates.
    loadable = meta_readable and source != "none"
    if state != COMPLETED:
        error = _first_line(status.get("error"))
        problems.insert(0, f"state {state}" + (f": {error}" if error else ""))
    if source == "none":
        problems.append("no metrics file")
    row: dict[str, Any] = {
        "sweep": identity("sweep", run_dir.parent.name),
        "run": identity("run", run_dir.name),
        "backend": identity("backend"),
        "mechanism": mechanism,
        # the sweep driver passes the label as the top-level override ``mechanism_label=<preset>``
        "mechanism_label": identity("mechanism_label", config.get("mechanism_label"), mechanism),
        "alpha": _as_float(identity("alpha")),
        "seed": _as_seed(identity("seed")),
        "state": state,
        "status_step": _as_seed(status.get("step")),
        "error": status.get("error"),
        "wall_time_s": _as_float(meta.get("wall_time_s")),
        "git_commit": meta.get("git_commit"),
        "config_hash": meta.get("config_hash"),
        "start_time": meta.get("start_time"),
        "end_time": meta.get("end_time"),
        "path": str(run_dir),
        "metrics_source": source,
        "included": not problems,
        "exclusion_reason": "; ".join(problems) if problems else None,
        "loadable": loadable,
    }
    row.update(flatten_config(config))
    axes = meta.get("axes") if isinstance(meta.get("axes"), Mapping) else {}
    # the identity columns already hold alpha, seed and the preset label; the other axes become factor columns
    row["factors"] = {str(name): value for name, value in axes.items() if name not in IDENTITY_COLUMNS}
    return row


def swept_factors(manifest: Mapping[str, Any] | None) -> dict[str, str]:
    """``{factor column: run-table config column}`` of the factors ``sweep.json``'s grid names beyond the identity
    columns (``eta`` and each ``extra`` axis): how a store written before runs recorded their axes gets them."""
    grid = (manifest or {}).get("grid") or {}
    factors: dict[str, str] = {}
    if grid.get("eta"):
        factors["eta"] = f"config.{ETA_CONFIG_KEY}"
    for key in grid.get("axes") or {}:
        factors[str(key).lstrip("+~")] = f"config.{str(key).lstrip('+~')}"
    return factors


def _fill_factors(rows: Sequence[dict[str, Any]], manifest: Mapping[str, Any] | None) -> list[str]:
    """Move each row's ``factors`` into columns (the sweep.json grid's axes where meta.json has none); return the
    factor column names in first-seen order."""
    from_manifest = swept_factors(manifest)
    names: dict[str, None] = {}
    for row in rows:
        factors = row.pop("factors", None) or {}
        for name, source in from_manifest.items():
            if name not in factors and source in row:
                factors[name] = row[source]
        for name, value in factors.items():
            row[name] = value
            names[name] = None
    return list(names)


def factor_columns(frame: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The swept factors of a run table or long table beyond the identity columns (``eta``, ``trainer.lr``, ...), in
    table order: the columns that are neither run-table, long-table nor ``config.*`` columns, nor in ``exclude``."""
    known = {*RUN_COLUMNS, *LONG_COLUMNS, "loadable", *exclude}
    return [c for c in frame.columns if c not in known and not str(c).startswith("config.")]


def _factor_values(values: pd.Series) -> pd.Series:
    """Numbers as float64 (NaN where a run lacks the factor); anything else as text (None stays missing)."""
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present):
        return pd.to_numeric(values, errors="coerce").astype(np.float64)
    return pd.Series([None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values],
                     index=values.index, dtype=object)


def add_run_columns(frame: pd.DataFrame, runs: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``frame`` (any table with ``sweep`` and ``run`` columns: long, summaries, histograms) with run-table
    ``columns`` (e.g. ``config.dataflex.actuator.params.eta``) joined on (sweep, run), so they can be group keys."""
    missing = [c for c in columns if c not in runs.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the run table; available: {list(runs.columns)}")
    wanted = [c for c in columns if c not in frame.columns]
    if not wanted:
        return frame
    lookup = runs[["sweep", "run", *wanted]].astype({"sweep": str, "run": str}).drop_duplicates(["sweep", "run"])
    keys_frame = pd.DataFrame({"sweep": frame["sweep"].astype(str).to_numpy(), "run": frame["run"].astype(str).to_numpy()})
    joined = keys_frame.merge(lookup, on=["sweep", "run"], how="left")
    result = frame.copy()
    for column in wanted:
        result[column] = joined[column].to_numpy()
    return result


def _missing_run_row(sweep: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    state = entry.get("state") or "unknown"
    return {
        "sweep": sweep, "run": str(entry["run"]), "backend": entry.get("backend"),
        "mechanism": entry.get("mechanism"), "mechanism_label": entry.get("mechanism_label", entry.get("mechanism")),
        "alpha": _as_float(entry.get("alpha")), "seed": _as_seed(entry.get("seed")), "state": state,
        "status_step": None, "error": entry.get("error"), "wall_time_s": math.nan, "git_commit": None,
        "config_hash": None, "start_time": None, "end_time": None, "path": None, "metrics_source": "none",
        "included": False, "exclusion_reason": f"no run folder (sweep.json state {state})", "loadable": False,
    }


def make_run_table(rows: Sequence[Mapping[str, Any]], factors: Sequence[str] = ()) -> pd.DataFrame:
    """Run-table rows (dicts with the :data:`RUN_COLUMNS` keys, any missing one left empty, plus ``factors`` and
    ``config.*`` keys) -> the run table with fixed column order and dtypes (factors, then config columns, sorted)."""
    frame = pd.DataFrame.from_records(list(rows)) if rows else pd.DataFrame(columns=list(RUN_COLUMNS))
    for column in (*RUN_COLUMNS, *factors):
        if column not in frame.columns:
            frame[column] = None
    config_columns = sorted(c for c in frame.columns if c not in RUN_COLUMNS and c not in factors)
    frame = frame[[*RUN_COLUMNS, *factors, *config_columns]].reset_index(drop=True)
    for column in factors:
        frame[column] = _factor_values(frame[column])
    for column in CATEGORY_COLUMNS:
        frame[column] = frame[column].astype("string").fillna("unknown" if column != "run" else "")
    frame["alpha"] = pd.to_numeric(frame["alpha"], errors="coerce").astype(np.float64)
    frame["seed"] = pd.array([_as_seed(v) for v in frame["seed"]], dtype="Int64")
    frame["status_step"] = pd.array([_as_seed(v) for v in frame["status_step"]], dtype="Int64")
    frame["wall_time_s"] = pd.to_numeric(frame["wall_time_s"], errors="coerce").astype(np.float64)
    frame["included"] = frame["included"].fillna(False).astype(bool)
    return frame


# --- building the long table -------------------------------------------------------------------------------------


def build_long_table(runs: pd.DataFrame, run_metrics: Mapping[int, RunMetrics]) -> pd.DataFrame:
    """Long table (module doc) from the run table and ``{run-table row position: RunMetrics}``.

    Every array is built once: per run, the ``(m, n)`` value block is flattened metric-major (so rows come out ordered
    by run, metric, step), non-finite values are dropped, and the blocks are concatenated in one call per column.
    """
    vocabulary = sorted({name for metrics in run_metrics.values() for name in metrics.names})
    code_of = {name: code for code, name in enumerate(vocabulary)}
    run_blocks, metric_blocks, step_blocks, value_blocks = [], [], [], []
    for position in sorted(run_metrics):
        metrics = run_metrics[position]
        if not metrics.names or len(metrics.steps) == 0:
            continue
        codes = np.fromiter((code_of[name] for name in metrics.names), dtype=np.int32, count=len(metrics.names))
        order = np.argsort(codes, kind="stable")
        values = metrics.values[order]
        n_steps = len(metrics.steps)
        flat_values = values.ravel()
        flat_steps = np.tile(metrics.steps, len(codes))
        flat_metrics = np.repeat(codes[order], n_steps)
        finite = np.isfinite(flat_values)
        if not finite.all():  # steps a metric was not logged at (NaN in the wide table) are dropped
            flat_values, flat_steps, flat_metrics = flat_values[finite], flat_steps[finite], flat_metrics[finite]
        value_blocks.append(flat_values)
        step_blocks.append(flat_steps)
        metric_blocks.append(flat_metrics)
        run_blocks.append(np.full(flat_values.size, position, dtype=np.int32))
    if value_blocks:
        run_positions = np.concatenate(run_blocks)
        metric_codes = np.concatenate(metric_blocks)
        steps = np.concatenate(step_blocks)
        values = np.concatenate(value_blocks)
    else:
        run_positions = np.empty(0, np.int32)
        metric_codes = np.empty(0, np.int32)
        steps = np.empty(0, np.int64)
        values = np.empty(0, np.float64)

    columns: dict[str, Any] = {}
    for column in CATEGORY_COLUMNS:
        per_run = pd.Categorical(runs[column].astype(str))
        columns[column] = pd.Categorical.from_codes(per_run.codes[run_positions], dtype=per_run.dtype)
    columns["alpha"] = runs["alpha"].to_numpy(dtype=np.float64)[run_positions]
    for column in factor_columns(runs):
        columns[column] = runs[column].to_numpy()[run_positions]
    columns["seed"] = runs["seed"].array.take(run_positions)
    columns["step"] = steps
    columns["metric"] = pd.Categorical.from_codes(metric_codes, categories=pd.Index(vocabulary, dtype=str))
    columns["value"] = values
    return pd.DataFrame(columns, copy=False)


def _load_run_metrics(
    runs: pd.DataFrame, loadable: Sequence[bool], metrics: Sequence[str] | None, include_incomplete: bool
) -> dict[int, RunMetrics]:
    """Read the metrics of every run to be included; an unreadable run is flagged in ``runs`` (in place)."""
    loaded: dict[int, RunMetrics] = {}
    for position in range(len(runs)):
        row = runs.iloc[position]
        source, path = row["metrics_source"], row["path"]
        if not loadable[position] or not (row["included"] or include_incomplete):
            continue
        run_dir = Path(path)
        # A damaged parquet falls back to the jsonl it was compacted from, when that is still there.
        attempts = ["parquet", "jsonl"] if source == "parquet" else ["jsonl"]
        errors: list[str] = []
        for attempt in attempts:
            if run_store.metrics_source(run_dir) is None:
                break
            try:
                loaded[position] = read_run_metrics(run_dir, metrics, source=attempt)
                runs.iat[position, runs.columns.get_loc("metrics_source")] = attempt
                break
            except FileNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - one damaged file must never stop a whole sweep
                errors.append(f"unreadable metrics.{attempt} ({type(exc).__name__}: {exc})")
        if position in loaded:
            runs.iat[position, runs.columns.get_loc("included")] = True
            runs.iat[position, runs.columns.get_loc("exclusion_reason")] = None
        else:
            runs.iat[position, runs.columns.get_loc("included")] = False
            reason = row["exclusion_reason"]
            runs.iat[position, runs.columns.get_loc("exclusion_reason")] = "; ".join(
                [*([reason] if isinstance(reason, str) and reason else []), *errors])
    return loaded


def load_runs(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
    histograms: bool = True,
    manifest: Mapping[str, Any] | None = None,
) -> SweepData:
    """Load run folders into :class:`SweepData`.

    ``metrics``: keys or ``fnmatch`` globs to load (default all). ``include_incomplete``: also load runs whose state is
    not ``completed`` (failed, running, interrupted: their ``metrics.jsonl`` when there is no parquet yet); they stay
    flagged by ``state``. ``histograms``: also read ``histograms.parquet`` (or ``.jsonl``) of the included runs.
    ``manifest``: a ``sweep.json`` payload that fills identity fields a ``meta.json`` lacks and adds its runs that
    have no folder (as excluded rows).
    """
    entries = _manifest_entries(manifest)
    rows = [describe_run(run_dir, entries) for run_dir in run_dirs]
    seen = {(row["sweep"], row["run"]) for row in rows}
    if len(seen) != len(rows):
        duplicates = sorted({f"{r['sweep']}/{r['run']}" for r in rows if sum(
            (r["sweep"], r["run"]) == (o["sweep"], o["run"]) for o in rows) > 1})
        raise ValueError(f"run folders with the same (sweep, run) identity: {duplicates}; load them separately")
    sweep_name = str((manifest or {}).get("sweep") or (rows[0]["sweep"] if rows else ""))
    listed = {row["run"] for row in rows}
    rows += [_missing_run_row(sweep_name, entry) for name, entry in entries.items() if name not in listed]
    loadable = [bool(row.pop("loadable")) for row in rows]
    factors = _fill_factors(rows, manifest)
    runs = make_run_table(rows, factors)
    run_metrics = _load_run_metrics(runs, loadable, metrics, include_incomplete)
    long = build_long_table(runs, run_metrics)
    histogram_table = load_histograms(runs) if histograms else empty_histogram_table()
    return SweepData(runs=runs, metrics=long, histograms=histogram_table,
                     manifest=dict(manifest) if manifest else None,
                     source=", ".join(str(p) for p in run_dirs[:3]) + (" ..." if len(run_dirs) > 3 else ""))


def load_sweep(
    sweep_dir: str | os.PathLike[str],
    *,
    metrics: Sequence[str] | None = None,
    include_incomplete: bool = False,
    histograms: bool = True,
    require_runs: bool = False,
) -> SweepData:
    """Load a sweep folder ``runs/<sweep>/``: every run folder under it plus the optional ``sweep.json``.

    ``require_runs``: raise :class:`NoRunStoreError` (a ``FileNotFoundError``) when the folder holds no run store.
    """
    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    run_dirs = find_run_dirs(sweep_dir)
    if require_runs and not run_dirs:
        raise NoRunStoreError(
            f"{sweep_dir} holds no run store: expected a sweep folder (runs/<sweep>/ with one <run>/meta.json per run, "
            f"as python -m sweeps writes it) or a run folder (holding meta.json, as python -m dataflex_rl.train "
            f"writes it)"
        )
    data = load_runs(run_dirs, metrics=metrics, include_incomplete=include_incomplete,
                     histograms=histograms, manifest=manifest)
    return SweepData(runs=data.runs, metrics=data.metrics, histograms=data.histograms, manifest=data.manifest,
                     source=str(sweep_dir))


def resolve_sweep_dir(path: str | os.PathLike[str] | None = None, *, start: str | os.PathLike[str] | None = None) -> Path:
    """The sweep folder to analyse: ``path`` if given, else ``$DATAFLEX_SWEEP_DIR``, else the newest sweep under the
    first ``runs/`` folder found walking up from ``start`` (default the working directory).

    "Newest" is the sub-folder of ``runs/`` holding run folders whose ``sweep.json`` or newest ``meta.json`` was
    modified last (``runs/latest`` when it exists, e.g. as a link the sweep driver keeps).
    """
    chosen = path if path is not None else os.environ.get(SWEEP_DIR_ENV)
    if chosen:
        sweep_dir = Path(chosen).expanduser()
        if not sweep_dir.is_dir():
            raise FileNotFoundError(f"sweep folder {str(sweep_dir)!r} does not exist (from {SWEEP_DIR_ENV} or path)")
        return sweep_dir
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        runs_root = folder / "runs"
        if runs_root.is_dir():
            if (runs_root / "latest").is_dir():
                return runs_root / "latest"
            meta_glob = f"*/{run_store.META_FILE}"
            candidates = [child for child in runs_root.iterdir() if child.is_dir() and any(child.glob(meta_glob))]
            if candidates:
                def modified(sweep: Path) -> float:
                    stamps = [p.stat().st_mtime for p in (sweep / "sweep.json", *sweep.glob(meta_glob))
                              if p.exists()]
                    return max(stamps)

                return max(candidates, key=modified)
    raise FileNotFoundError(f"no sweep found: set {SWEEP_DIR_ENV}=runs/<sweep> or run from a folder under which "
                            f"runs/<sweep>/<run>/meta.json exists (searched up from {here})")


# --- histograms --------------------------------------------------------------------------------------------------


def empty_histogram_table() -> pd.DataFrame:
    """A histogram table with no rows and the columns of :data:`HISTOGRAM_COLUMNS`."""
    frame = pd.DataFrame({column: pd.Series(dtype=object) for column in HISTOGRAM_COLUMNS})
    frame["alpha"] = frame["alpha"].astype(np.float64)
    frame["seed"] = frame["seed"].astype("Int64")
    frame["step"] = frame["step"].astype(np.int64)
    return frame


def _histogram_frame(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """``step, name, edges, counts`` rows -> numpy ``edges`` ``(k+1,)`` and ``counts`` ``(k,)``; rows whose edges and
    counts disagree in length are dropped with a warning; sorted by (name, step)."""
    frame = frame[["step", "name", "edges", "counts"]].copy()
    frame["edges"] = [np.asarray(e, dtype=np.float64) for e in frame["edges"]]
    frame["counts"] = [np.asarray(c, dtype=np.float64) for c in frame["counts"]]
    consistent = np.array([len(e) == len(c) + 1 for e, c in zip(frame["edges"], frame["counts"], strict=True)],
                          dtype=bool)
    if not consistent.all():
        logger.warning("%s: dropped %d histogram row(s) whose edges are not one longer than counts", source,
                       int((~consistent).sum()))
    frame = frame[consistent]
    frame["step"] = frame["step"].astype(np.int64)
    frame["name"] = frame["name"].astype(str)
    return frame.drop_duplicates(["step", "name"], keep="last").sort_values(["name", "step"])


def read_histograms_file(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A run's histograms (``path`` names its ``histograms.parquet`` or ``.jsonl``; read by the run store's reader)
    -> ``step`` (int64), ``name`` (str), ``edges`` ``(k+1,)`` and ``counts`` ``(k,)`` numpy arrays."""
    return _histogram_frame(run_store.load_histograms(Path(path).parent), str(path))


def load_histograms(runs: pd.DataFrame) -> pd.DataFrame:
    """Histogram table (identity columns, the factor columns, then ``step, name, edges, counts``) of the included
    runs of a run table."""
    factors = factor_columns(runs)
    frames = []
    for _, row in runs[runs["included"] & runs["path"].notna()].iterrows():
        run_dir = Path(row["path"])
        try:
            frame = _histogram_frame(run_store.load_histograms(run_dir), str(run_dir))
        except Exception as exc:  # noqa: BLE001 - histograms are optional; never fail a sweep over them
            logger.warning("ignoring unreadable histograms of %s: %s", run_dir, exc)
            continue
        if frame.empty:
            continue
        for column in (*IDENTITY_COLUMNS, *factors):
            frame.insert(len(frame.columns) - 4, column, row[column])
        frames.append(frame)
    if not frames:
        return empty_histogram_table()
    table = pd.concat(frames, ignore_index=True)[[*IDENTITY_COLUMNS, *factors, *HISTOGRAM_COLUMNS[-4:]]]
    table["seed"] = table["seed"].astype("Int64")
    table["alpha"] = table["alpha"].astype(np.float64)
    return table


# --- W&B ---------------------------------------------------------------------------------------------------------

# Where each identity field may sit in a W&B run's flattened config, first match wins: the W&B logger adds
# ``run_identity`` (the meta.json identity) to the resolved config. The run name ``<sweep>-a<alpha>-s<seed>``, the
# group and the tags (mechanism, backend) are the fallbacks.
WANDB_IDENTITY_KEYS: dict[str, tuple[str, ...]] = {
    "sweep": ("run_identity.sweep", "sweep"),
    "run": ("run_identity.run",),
    "backend": ("run_identity.backend", "backend"),
    "mechanism": ("run_identity.mechanism", "dataflex.mechanism", "mechanism"),
    "mechanism_label": ("run_identity.mechanism_label", "mechanism_label", "dataflex.mechanism_label"),
    "alpha": ("run_identity.alpha", "alpha", "dataflex.actuator.params.alpha"),
    "seed": ("run_identity.seed", "seed"),
    "git_commit": ("run_identity.git_commit", "git_commit"),
    "config_hash": ("run_identity.config_hash", "config_hash"),
}
WANDB_STATES: dict[str, str] = {
    "finished": "completed", "running": "running", "pending": "pending", "crashed": "failed", "failed": "failed",
    "killed": "interrupted", "preempted": "interrupted", "preempting": "running",
}
_RUN_NAME_PATTERN = re.compile(r"-a(?P<alpha>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)-s(?P<seed>-?\d+)$")
DEFAULT_CACHE_DIR = Path(os.environ.get("DATAFLEX_CACHE_DIR", "~/.cache/dataflex-rl")).expanduser() / "wandb"
_CACHE_FILES = ("runs.parquet", "metrics.parquet", "histograms.parquet")


def _wandb_identity(run: Any, flat_config: Mapping[str, Any], known_backends: Sequence[str]) -> dict[str, Any]:
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
    names = tuple(_select_names(sorted({k for row in by_step.values() for k in row}), metrics))
    values = np.full((len(names), len(steps)), np.nan)
    index = {name: i for i, name in enumerate(names)}
    for column, step in enumerate(steps):
        for key, value in by_step[int(step)].items():
            if key in index:
                values[index[key], column] = value
    return RunMetrics(steps, names, values), histograms


def _cache_folder(cache_dir: Path, entity: str, project: str, group: str | None, query: Mapping[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(query, sort_keys=True, default=str).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{entity}__{project}__{group or 'all'}")
    return cache_dir / f"{safe}__{digest}"


def parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding mixed types (a config key that is an int in one run and text in another) -> text."""
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            kinds = {type(v) for v in frame[column] if v is not None and not (isinstance(v, float) and math.isnan(v))}
            if len(kinds) > 1 or (kinds and not kinds <= {str}):
                frame[column] = [None if v is None else str(v) for v in frame[column]]
    return frame


def write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` through the run store's atomic writer (group-readable, no temp file left behind)."""
    from dataflex_rl.tracking.run_store import atomic_path

    with atomic_path(path) as temporary:
        frame.to_parquet(temporary, index=False)


def load_wandb_offline(root: str | os.PathLike[str], **options: Any) -> SweepData:
    """Offline W&B run files under ``root`` -> :class:`SweepData` (see :mod:`analysis.wandb_offline`)."""
    from analysis.wandb_offline import load_wandb_offline as load_offline  # imports this module

    return load_offline(root, **options)


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
    the run name ``<sweep>-a<alpha>-s<seed>``, the group and the tags. W&B states map to run-store states by :data:`WANDB_STATES` (``finished`` -> ``completed``, ``crashed``
    -> ``failed``, ``killed`` -> ``interrupted``). ``step_key``: the history key holding the training step.

    Cache: ``<cache_dir>/<entity>__<project>__<group>__<hash of the query>/`` holding ``runs.parquet``,
    ``metrics.parquet`` and ``histograms.parquet``, written once the whole download succeeded. The cache is never
    refreshed on its own (a sweep still running needs ``refresh=True``). ``cache_dir`` default:
    ``$DATAFLEX_CACHE_DIR/wandb`` (``~/.cache/dataflex-rl/wandb``).
    """
    query = {"filters": dict(filters or {}), "metrics": list(metrics) if metrics is not None else None,
             "step_key": step_key, "include_incomplete": include_incomplete}
    folder = _cache_folder(Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR, entity, project, group,
                           query)
    source = f"wandb:{entity}/{project}" + (f"?group={group}" if group else "")
    if not refresh and all((folder / name).is_file() for name in _CACHE_FILES):
        runs = pd.read_parquet(folder / "runs.parquet")
        histograms = pd.read_parquet(folder / "histograms.parquet")
        for column in ("edges", "counts"):
            histograms[column] = [np.asarray(v, dtype=np.float64) for v in histograms[column]]
        return SweepData(runs=runs, metrics=pd.read_parquet(folder / "metrics.parquet"), histograms=histograms,
                         source=source + f" (cache {folder})")

    if api is None:
        import wandb  # imported here: slow to import and only needed for online runs

        api = wandb.Api()
    run_filters = dict(filters or {})
    if group is not None:
        run_filters["group"] = group
    rows: list[dict[str, Any]] = []
    run_metrics: dict[int, RunMetrics] = {}
    histogram_records: list[dict[str, Any]] = []
    for wandb_run in api.runs(f"{entity}/{project}", filters=run_filters or None):
        config = dict(getattr(wandb_run, "config", None) or {})
        flat = flatten_config({k: v for k, v in config.items() if not str(k).startswith("_")})
        identity = _wandb_identity(wandb_run, flat, known_backends)
        raw_state = str(getattr(wandb_run, "state", "unknown")).lower()
        state = WANDB_STATES.get(raw_state, raw_state)
        summary = getattr(wandb_run, "summary", None) or {}
        row: dict[str, Any] = {
            **{k: identity[k] for k in ("sweep", "run", "backend", "mechanism", "mechanism_label")},
            "alpha": _as_float(identity["alpha"]), "seed": _as_seed(identity["seed"]), "state": state,
            "status_step": None,
            "error": None, "wall_time_s": _as_float(summary.get("_runtime") if hasattr(summary, "get") else None),
            "git_commit": identity["git_commit"], "config_hash": identity["config_hash"],
            "start_time": getattr(wandb_run, "created_at", None), "end_time": None,
            "path": f"wandb:{entity}/{project}/{getattr(wandb_run, 'id', identity['run'])}", "metrics_source": "wandb",
            "included": state == COMPLETED,
            "exclusion_reason": None if state == COMPLETED else f"state {state} (W&B state {raw_state})",
            **flat,
        }
        position = len(rows)
        rows.append(row)
        if state != COMPLETED and not include_incomplete:
            continue
        try:
            run_metrics[position], records = _wandb_rows(wandb_run, step_key, metrics, page_size)
        except Exception as exc:  # noqa: BLE001 - one run whose history fails must not lose the others
            row["included"] = False
            row["exclusion_reason"] = "; ".join(filter(None, [row["exclusion_reason"],
                                                              f"history download failed ({exc})"]))
            continue
        row["included"] = True
        if len(run_metrics[position].steps):
            row["status_step"] = int(run_metrics[position].steps[-1])
        histogram_records += [{**{c: row[c] for c in IDENTITY_COLUMNS}, **r} for r in records]
    runs = make_run_table(rows)
    long = build_long_table(runs, run_metrics)
    histograms = (pd.DataFrame.from_records(histogram_records, columns=list(HISTOGRAM_COLUMNS))
                  if histogram_records else empty_histogram_table())
    histograms["seed"] = histograms["seed"].astype("Int64")

    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(parquet_safe(runs), folder / "runs.parquet")
    write_parquet_atomic(long, folder / "metrics.parquet")
    write_parquet_atomic(histograms, folder / "histograms.parquet")
    return SweepData(runs=runs, metrics=long, histograms=histograms, source=source)
