"""Run store (or W&B) -> one long metrics table plus a run table.

Long table (:attr:`SweepData.metrics`), one row per logged ``(run, metric, step)`` with a finite value, ordered by run
(run-table order), then metric (alphabetical), then step:

    sweep, run, backend, mechanism, mechanism_label (category) | alpha (float64) | seed (Int64) |
    step (int64) | metric (category) | value (float64)

``mechanism_label`` names the mechanism configuration (``baseline``, ``ar``, ``lopti``, ...) when ``meta.json`` carries
one, else it repeats ``mechanism``; analysis treats it as a factor beside ``alpha``.

Every other swept factor is a column too, between ``alpha`` and ``seed`` (``eta``, ``trainer.lr``, ``task``, ...): its
name and value come from ``meta.json``'s ``axes`` (the grid's axes, values read from the run's resolved config). A
store without axes (a run outside a grid: alpha and seed only) has no factor columns. :func:`factor_columns` lists
them. The W&B
loaders (:func:`load_wandb`, :func:`load_wandb_offline`) read the same axes from the W&B config's
``run_identity.axes`` (see :mod:`analysis.wandb_runs`), so their tables group and pair the same way.

The column sets, :class:`SweepData` and the table builders live in :mod:`analysis.frames`; this module re-exports
them, so one import gives ``load.SweepData``, ``load.factor_columns``, ...

Run table (:attr:`SweepData.runs`), one row per run folder (plus one per ``sweep.json`` entry without a folder):
identity columns as above, then ``state``, ``status_step``, ``error``, ``wall_time_s``, ``git_commit``,
``config_hash``, ``start_time``, ``end_time``, ``environment`` (the numeric environment as a label,
:func:`environment_label`; null when ``meta.json`` records none, as in W&B runs), ``warm_start``,
``warm_start_design``, ``warm_start_seed`` (:func:`warm_start_columns`), ``path``, ``metrics_source``
(``parquet``, ``jsonl``, ``wandb`` or ``none``), ``included`` (bool: its metrics are in the long table),
``exclusion_reason``, the factor columns and the resolved config flattened to ``config.<dotted.key>`` columns (lists
and mappings as JSON text).

A run whose ``status.json`` state is not ``completed`` is excluded (its metrics are not loaded) unless
``include_incomplete=True``; a run whose record fails the run store's check (:func:`run_store.verify_run`: a
symbolic link, a file missing or unreadable, a ``config.yaml`` or ``meta.json`` changed after the run) or whose
metrics cannot be read is always excluded, the reasons in ``exclusion_reason``. Nothing raises for one bad run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.frames import (
    CATEGORY_COLUMNS,
    COMPLETED,
    HISTOGRAM_COLUMNS,
    IDENTITY_COLUMNS,
    LONG_COLUMNS,
    RUN_COLUMNS,
    RUN_STATES,
    RunMetrics,
    SweepData,
    as_float,
    as_seed,
    axis_factors,
    build_long_table,
    empty_histogram_table,
    factor_columns,
    flatten_config,
    make_run_table,
    parquet_safe,
    pop_factors,
    write_parquet_atomic,
)
from analysis.wandb_runs import DEFAULT_CACHE_DIR, WANDB_IDENTITY_KEYS, WANDB_STATES, load_wandb
from dataflex_rl.tracking import run_store

# The loaders and the table vocabulary live in analysis.frames / analysis.wandb_runs / analysis.wandb_offline;
# notebooks and the tests reach them through this module.
__all__ = [
    "CATEGORY_COLUMNS", "COMPLETED", "DEFAULT_CACHE_DIR", "HISTOGRAM_COLUMNS", "IDENTITY_COLUMNS",
    "LONG_COLUMNS", "RUN_COLUMNS", "RUN_STATES", "SWEEP_DIR_ENV", "WANDB_IDENTITY_KEYS", "WANDB_STATES",
    "NoRunStoreError", "RunMetrics", "SeveralSweepsError", "check_one_sweep", "sweeps_under", "SweepData", "add_run_columns", "build_long_table", "describe_run",
    "ENVIRONMENT_PARTS", "ENVIRONMENT_SEPARATOR", "RESUMED_UNDER", "empty_histogram_table", "environment_label",
    "environment_parts", "factor_columns", "find_run_dirs", "flatten_config", "load_histograms", "load_runs",
    "load_sweep", "load_wandb", "load_wandb_offline", "make_run_table", "parquet_safe", "read_histograms_file",
    "read_manifest", "read_metrics_jsonl", "read_metrics_parquet", "read_run_metrics", "resolve_sweep_dir",
    "write_parquet_atomic",
]

logger = logging.getLogger(__name__)


_SKIPPED_FOLDERS = frozenset({"checkpoints", "wandb", "report", "__pycache__", ".git"})
SWEEP_DIR_ENV = "DATAFLEX_SWEEP_DIR"


class NoRunStoreError(FileNotFoundError):
    """A folder given as a sweep holds no run store."""


class SeveralSweepsError(ValueError):
    """A folder given as one sweep holds several sweeps (``runs/`` itself)."""


def sweeps_under(root: str | os.PathLike[str]) -> list[str]:
    """Names of the sweep folders directly under ``root`` when ``root`` is a folder of sweeps (``runs/``): it has no
    ``sweep.json`` and no run of its own, and a child holds a ``sweep.json`` or run folders. Empty otherwise."""
    root = Path(root)
    if not root.is_dir() or (root / run_store.SWEEP_FILE).is_file() or run_store.is_run_store(root):
        return []
    children = sorted(child for child in root.iterdir() if child.is_dir() and not child.name.startswith("."))
    if any(run_store.is_run_store(child) for child in children):
        return []
    return [child.name for child in children
            if (child / run_store.SWEEP_FILE).is_file() or any(run_store.is_run_store(run) for run in child.iterdir()
                                                         if run.is_dir())]


def check_one_sweep(sweep_dir: str | os.PathLike[str]) -> None:
    """Refuse a folder of several sweeps where one sweep is expected (:class:`SeveralSweepsError` naming them)."""
    names = sweeps_under(sweep_dir)
    if len(names) > 1:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise SeveralSweepsError(f"{sweep_dir} is a folder of sweeps ({shown}), not one sweep: give one of them, "
                                 f"e.g. {Path(sweep_dir) / names[0]} (make report SWEEP={names[0]})")


# --- small readers -----------------------------------------------------------------------------------------------


def _first_line(text: Any) -> str | None:
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return None
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else None


def _run_metrics(frame: pd.DataFrame) -> RunMetrics:
    """A wide frame from :func:`run_store.read_metrics` -> :class:`RunMetrics` (non-numeric columns skipped)."""
    names = tuple(c for c in frame.columns if c != "step" and pd.api.types.is_numeric_dtype(frame[c]))
    values = np.empty((len(names), len(frame)), dtype=np.float64)
    for row, name in enumerate(names):
        values[row] = frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
    return _sorted_unique(frame["step"].to_numpy(dtype=np.int64), names, values)


def read_run_metrics(run_dir: str | os.PathLike[str], metrics: Sequence[str] | None = None,
                     source: str | None = None, skip_bad: bool = True) -> RunMetrics:
    """A run's metrics through the run store's reader (``metrics.parquet``, else ``metrics.jsonl``; ``source``
    forces one); ``metrics``: keys or ``fnmatch`` globs. Corrupt jsonl lines are skipped with a warning (``skip_bad``;
    False: they raise)."""
    return _run_metrics(run_store.read_metrics(run_dir, metrics, source=source, skip_bad=skip_bad))


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

    The search does not descend into a run folder, nor into ``checkpoints``, ``wandb`` or ``report`` folders. A
    symbolic link to a run folder is listed, not followed (the loader excludes it, :func:`describe_run`).
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
        # a link to a run folder is listed (the loader excludes it, naming the link), never followed
        links = [Path(current) / f for f in folders if (Path(current) / f).is_symlink()]
        found += [link for link in links if run_store.is_run_store(link)]
    return sorted(found)


def read_manifest(sweep_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``sweep.json`` of a sweep folder, or None when absent or unreadable (it is optional extra information)."""
    try:
        return run_store.read_sweep_record(sweep_dir)
    except ValueError as exc:
        logger.warning("ignoring unreadable sweep.json: %s", exc)
        return None


def _manifest_entries(manifest: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    if not manifest or not isinstance(manifest.get("runs"), list):
        return {}
    return {str(e["run"]): dict(e) for e in manifest["runs"] if isinstance(e, Mapping) and "run" in e}


def _read_part(read: Any, run_dir: Path, name: str) -> dict[str, Any]:
    """``read(run_dir)`` (a run store reader of ``name``), ``{}`` when missing or unreadable (the run store's check,
    :func:`run_store.verify_run`, names the problem)."""
    try:
        return read(run_dir) or {}
    except (OSError, ValueError) as exc:
        logger.debug("unreadable %s: %s", name, exc)
        return {}


def _read_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config, ``{}`` when missing or unreadable (only logged: the row is still usable)."""
    try:
        return run_store.read_config(run_dir) or {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable config: %s", exc)
        return {}


# --- the numeric environment ------------------------------------------------------------------------------------

# A label's parts, in order, joined by the separator; a run resumed under another environment has the last part.
ENVIRONMENT_PARTS: tuple[str, ...] = ("CPU kernels", "BLAS", "threads", "CPU", "resumed under")
ENVIRONMENT_SEPARATOR = " · "
RESUMED_UNDER = "resumed under "


def environment_parts(environment: Mapping[str, Any]) -> list[str]:
    """The first four :data:`ENVIRONMENT_PARTS` of one ``meta.json`` environment record (:mod:`run_store.meta`):
    ``AVX2 (ATEN_CPU_CAPABILITY=avx2)``, ``mkl``, ``1 thread``, ``Intel(R) Xeon(R) Processor (x86_64)``."""
    kernels = str(environment.get("cpu_capability") or "unknown kernels")
    if environment.get("aten_cpu_capability") is not None:
        kernels += f" (ATEN_CPU_CAPABILITY={environment['aten_cpu_capability']})"
    threads = environment.get("threads")
    cpu, machine = environment.get("cpu"), environment.get("machine")
    return [kernels, str(environment.get("blas") or "unknown BLAS"),
            f"{threads} thread{'' if threads == 1 else 's'}",
            f"{cpu} ({machine})" if cpu and machine and cpu != machine else str(cpu or machine or "unknown CPU")]


def environment_label(meta: Mapping[str, Any]) -> str | None:
    """A run's numeric environment as one stable label, its :func:`environment_parts` joined by
    :data:`ENVIRONMENT_SEPARATOR`, e.g. ``AVX512 · mkl · 1 thread · Intel(R) Xeon(R) Processor (x86_64)``; None when
    ``meta.json`` records no environment.

    A run resumed under another environment gets a last part naming what each resumed session changed, e.g.
    ``resumed under AVX2 (ATEN_CPU_CAPABILITY=avx2); then AVX512``: its label differs from every unresumed run's, so
    it never passes for a run of one environment."""
    environment = meta.get("environment")
    if not isinstance(environment, Mapping):
        return None
    parts = environment_parts(environment)
    changed, previous = [], parts
    for change in meta.get("environment_changes") or ():
        current = environment_parts(change)
        changed.append(", ".join(part for part, before in zip(current, previous, strict=True) if part != before))
        previous = current
    if changed:
        parts.append(RESUMED_UNDER + "; then ".join(changed))
    return ENVIRONMENT_SEPARATOR.join(parts)


def _identity_columns(run_dir: Path, meta: Mapping[str, Any], entry: Mapping[str, Any],
                      config: Mapping[str, Any]) -> dict[str, Any]:
    """The identity columns of a run folder: each from ``meta.json``, else its ``sweep.json`` entry, else a fallback
    (the folder names, the config's preset label, the mechanism)."""

    def identity(key: str, *fallbacks: Any) -> Any:
        """First non-null of meta.json, the sweep.json entry, then ``fallbacks``."""
        return next((value for value in (meta.get(key), entry.get(key), *fallbacks) if value is not None), None)

    mechanism = identity("mechanism")
    return {
        "sweep": identity("sweep", run_dir.parent.name),
        "run": identity("run", run_dir.name),
        "backend": identity("backend"),
        "mechanism": mechanism,
        # the sweep driver passes the label as the top-level override ``mechanism_label=<preset>``
        "mechanism_label": identity("mechanism_label", config.get("mechanism_label"), mechanism),
        "alpha": as_float(identity("alpha")),
        "seed": as_seed(identity("seed")),
    }


def describe_run(
    run_dir: str | os.PathLike[str], manifest_entries: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """One run-table row (see module doc) from a run folder's ``meta.json``, ``status.json`` and ``config.yaml``.

    ``included`` is True when the run completed, its record passes the run store's check
    (:func:`run_store.verify_run`) and it has a metrics file; the loaders may still flip it. ``loadable`` (dropped by
    the loaders) says whether the record passes and the files can be read, whatever the state. ``manifest_entries``:
    ``sweep.json`` entries by run name, filling identity fields ``meta.json`` lacks. Never raises for a damaged
    folder: the problem goes into ``exclusion_reason``. ``factors`` holds the recorded axes beyond the identity
    columns (the loaders turn them into columns).
    """
    run_dir = Path(run_dir)
    entries = manifest_entries or {}
    # The run store's check of the record (a real folder, status.json, config.yaml as meta.json recorded it): a run
    # that fails it is excluded, with its reasons. A link is not read through: its identity is its own name.
    problems = run_store.verify_run(run_dir)
    linked = run_dir.is_symlink()
    meta = {} if linked else _read_part(run_store.read_meta, run_dir, "meta.json")
    meta_readable = bool(meta)
    status = {} if linked else _read_part(run_store.read_status, run_dir, "status.json")
    config = {} if linked else _read_config(run_dir)
    entry = dict(entries.get(str(meta.get("run")), entries.get(run_dir.name, {})))
    state = status.get("state") or entry.get("state") or "unknown"
    source = "none" if linked else run_store.metrics_source(run_dir) or "none"
    # A run is loadable when its record passes the check and its files can be read; only its state may still keep
    # it out of the aggregates.
    loadable = meta_readable and source != "none" and not problems
    if state != COMPLETED:
        error = _first_line(status.get("error"))
        problems.insert(0, f"state {state}" + (f": {error}" if error else ""))
    if source == "none":
        problems.append("no metrics file")
    row: dict[str, Any] = {
        **_identity_columns(run_dir, meta, entry, config),
        "state": state,
        "status_step": as_seed(status.get("step")),
        "error": status.get("error"),
        "wall_time_s": as_float(meta.get("wall_time_s")),
        **{key: meta.get(key) for key in ("git_commit", "config_hash", "start_time", "end_time")},
        "environment": environment_label(meta),
        **warm_start_columns(meta.get("warm_start")),
        "path": str(run_dir),
        "metrics_source": source,
        "included": not problems,
        "exclusion_reason": "; ".join(problems) if problems else None,
        "loadable": loadable,
    }
    row.update(flatten_config(config))
    # the identity columns already hold alpha, seed and the preset label; the other axes become factor columns
    row["factors"] = axis_factors(meta.get("axes"))
    return row


def warm_start_columns(record: Any) -> dict[str, Any]:
    """The run table's warm-start columns from ``meta.json``'s ``warm_start``: ``warm_start`` (the checkpoint the run
    started from: runs with the same one share a warm start), ``warm_start_design`` and ``warm_start_seed``."""
    record = record if isinstance(record, Mapping) else {}
    return {"warm_start": record.get("checkpoint"), "warm_start_design": record.get("design"),
            "warm_start_seed": as_seed(record.get("sft_seed"))}


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
        "alpha": as_float(entry.get("alpha")), "seed": as_seed(entry.get("seed")), "state": state,
        "status_step": None, "error": entry.get("error"), "wall_time_s": math.nan, "git_commit": None,
        "config_hash": None, "start_time": None, "end_time": None, "path": None, "metrics_source": "none",
        "included": False, "exclusion_reason": f"no run folder (sweep.json state {state})", "loadable": False,
    }


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
        # A completed run claims every step: a line of it that cannot be read excludes it (named), where an
        # unfinished run's torn last lines are skipped.
        strict = row["state"] == COMPLETED
        for attempt in attempts:
            if run_store.metrics_source(run_dir) is None:
                break
            try:
                loaded[position] = read_run_metrics(run_dir, metrics, source=attempt, skip_bad=not strict)
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
    factors = pop_factors(rows)
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
                    stamps = [p.stat().st_mtime for p in (sweep / run_store.SWEEP_FILE, *sweep.glob(meta_glob))
                              if p.exists()]
                    return max(stamps)

                return max(candidates, key=modified)
    raise FileNotFoundError(f"no sweep found: set {SWEEP_DIR_ENV}=runs/<sweep> or run from a folder under which "
                            f"runs/<sweep>/<run>/meta.json exists (searched up from {here})")


# --- histograms --------------------------------------------------------------------------------------------------


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


# --- W&B (analysis.wandb_runs: online; analysis.wandb_offline: offline run files) --------------------------------


def load_wandb_offline(root: str | os.PathLike[str], **options: Any) -> SweepData:
    """Offline W&B run files under ``root`` -> :class:`SweepData` (see :mod:`analysis.wandb_offline`)."""
    # imported here: reading W&B's run files needs wandb's protobuf modules, slow to import and only needed here
    from analysis.wandb_offline import load_wandb_offline as load_offline

    return load_offline(root, **options)
