"""Run store -> :class:`~analysis.frames.SweepData` (columns and exclusions: docs/analysis.md, "The tables")."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.environment import abbreviated, environment_label
from analysis.frames import (IDENTITY_COLUMNS, RunMetrics, SweepData, as_float, as_seed, axis_factors, build_long_table,
                             factor_columns, flatten_config, histogram_table, make_run_table,
                             pop_factors)
from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.identity import SAME_ARM_RELATIVE, same_arm

logger = logging.getLogger(__name__)

_SKIPPED_FOLDERS = frozenset({"checkpoints", "wandb", "report", "__pycache__", ".git"})
SWEEP_DIR_ENV = "DATAFLEX_SWEEP_DIR"


class NoRunStoreError(FileNotFoundError):
    """A folder given as a sweep holds no run store."""


class SeveralSweepsError(ValueError):
    """A folder given as one sweep holds several sweeps (``runs/`` itself)."""


class ArmValueError(ValueError):
    """Two runs record values of one factor that the arm rule cannot tell apart but that differ."""


def check_arm_values(runs: pd.DataFrame) -> None:
    """Refuse included runs whose values of ``alpha`` or a swept factor are one arm by
    :func:`~dataflex_rl.tracking.identity.same_arm` yet not equal (two groups would print one label)."""
    included = runs[runs["included"].astype(bool)]
    for column in ("alpha", *factor_columns(included)):
        values = included[column].dropna()
        if not pd.api.types.is_float_dtype(values.dtype):
            continue
        distinct = sorted(set(values.tolist()))
        for low, high in zip(distinct, distinct[1:]):
            if same_arm(low, high):
                names = [included.loc[values.index[values == value][0], "run"] for value in (low, high)]
                raise ArmValueError(f"runs {names[0]} and {names[1]} record {column} = {low!r} and {high!r}: one arm "
                                    f"by the arm rule (within a relative {SAME_ARM_RELATIVE:g}), two values; analyse "
                                    f"them apart or move one run away")


def check_one_sweep(sweep_dir: str | os.PathLike[str]) -> None:
    """Raise :class:`SeveralSweepsError` for a folder of sweeps: no sweep.json or run of its own, children that are."""
    root = Path(sweep_dir)
    if not root.is_dir() or (root / run_store.SWEEP_FILE).is_file() or run_store.is_run_store(root):
        return
    children = sorted(child for child in root.iterdir() if child.is_dir() and not child.name.startswith("."))
    if any(run_store.is_run_store(child) for child in children):
        return
    names = [child.name for child in children
             if (child / run_store.SWEEP_FILE).is_file() or any(run_store.is_run_store(run) for run in child.iterdir()
                                                          if run.is_dir())]
    if len(names) > 1:
        raise SeveralSweepsError(f"{sweep_dir} is a folder of sweeps ({abbreviated(names, 8)}), not one sweep: give "
                                 f"one of them, e.g. {Path(sweep_dir) / names[0]} (make report SWEEP={names[0]})")


def read_run_metrics(run_dir: str | os.PathLike[str], metrics: Sequence[str] | None = None,
                     source: str | None = None, skip_bad: bool = True) -> RunMetrics:
    """A run's numeric metrics through :func:`run_store.read_metrics_table` (``metrics``: keys or globs); a metric
    logged as NaN or infinite at any step is kept out whole and named in ``nonfinite``."""
    table = run_store.read_metrics_table(run_dir, metrics, source=source, skip_bad=skip_bad)
    steps = table.column("step").to_numpy().astype(np.int64)
    order = np.argsort(steps, kind="stable")
    keep = np.append(np.diff(steps[order]) > 0, True)  # a repeated step keeps its last row
    names, rows, nonfinite = [], [], {}
    for name in table.column_names:
        column = table.column(name)
        if name == "step" or not pa.types.is_floating(column.type):
            continue
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)[order][keep]
        logged = column.is_valid().to_numpy(zero_copy_only=False)[order][keep]
        broken = logged & ~np.isfinite(values)
        if broken.any():
            nonfinite[name] = tuple(int(step) for step in steps[order][keep][broken])
            values = np.full_like(values, np.nan)
        names.append(name)
        rows.append(values)
    values = np.vstack(rows) if rows else np.empty((0, int(keep.sum())))
    return RunMetrics(steps[order][keep], tuple(names), values, nonfinite)


def find_run_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Run folders under ``root`` (or ``root`` itself), sorted; a symbolic link to one is listed, not followed."""
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
        links = [Path(current) / f for f in folders if (Path(current) / f).is_symlink()]
        found += [link for link in links if run_store.is_run_store(link)]
    return sorted(found)


def _read_part(read: Any, run_dir: Path, level: int = logging.DEBUG) -> dict[str, Any]:
    """``read(run_dir)``, ``{}`` when missing or unreadable (:func:`run_store.verify_run` names the problem)."""
    try:
        return {} if run_dir.is_symlink() else read(run_dir) or {}
    except (OSError, ValueError) as exc:
        logger.log(level, "ignoring unreadable part of %s: %s", run_dir, exc)
        return {}


def describe_run(run_dir: str | os.PathLike[str], manifest_entries: Mapping[str, Mapping[str, Any]] | None = None,
                 sweep: str | None = None) -> dict[str, Any]:
    """One run-table row of a run folder, never raising for a damaged one (``exclusion_reason`` names the problem).

    ``loadable``: the record passes :func:`run_store.verify_run` and its files can be read, whatever the state.
    ``sweep``: the name in the folder's ``sweep.json``; a run it does not list, or of another sweep, is excluded."""
    run_dir = Path(run_dir)
    entries = manifest_entries or {}
    problems = run_store.verify_run(run_dir)
    meta, status = _read_part(run_store.read_meta, run_dir), _read_part(run_store.read_status, run_dir)
    config = _read_part(run_store.read_config, run_dir, logging.WARNING)
    entry = dict(entries.get(str(meta.get("run")), entries.get(run_dir.name, {})))
    if sweep is not None and meta and (not entry or meta.get("sweep") != sweep):
        problems.append(f"not a run of sweep {sweep}: its sweep.json does not list {run_dir.name}"
                        if not entry else f"a run of sweep {meta.get('sweep')!r}, not of {sweep}")
    state = status.get("state") or entry.get("state") or "unknown"
    source = "none" if run_dir.is_symlink() else run_store.metrics_source(run_dir) or "none"
    warm_start = meta.get("warm_start") if isinstance(meta.get("warm_start"), Mapping) else {}
    loadable = bool(meta) and source != "none" and not problems
    if state != run_store.COMPLETED:
        error = str(status.get("error") or "").strip().splitlines()  # the exception's line, after its traceback
        problems.insert(0, f"state {state}" + (f": {error[-1]}" if error else ""))
    if source == "none":
        problems.append("no metrics file")

    def identity(key: str, *fallbacks: Any) -> Any:  # meta.json, else the sweep.json entry, else a fallback
        return next((value for value in (meta.get(key), entry.get(key), *fallbacks) if value is not None), None)

    return {
        "sweep": identity("sweep", run_dir.parent.name), "run": identity("run", run_dir.name),
        "backend": identity("backend"), "mechanism": identity("mechanism"),
        # the sweep driver passes the label as the top-level override ``mechanism_label=<preset>``
        "mechanism_label": identity("mechanism_label", config.get("mechanism_label"), identity("mechanism")),
        "alpha": as_float(identity("alpha")), "seed": as_seed(identity("seed")), "state": state,
        "status_step": as_seed(status.get("step")), "error": status.get("error"),
        "wall_time_s": as_float(meta.get("wall_time_s")),
        **{key: meta.get(key) for key in ("git_commit", "config_hash", "start_time", "end_time")},
        "environment": environment_label(meta), "warm_start": warm_start.get("checkpoint"),
        "warm_start_design": warm_start.get("design"), "warm_start_seed": as_seed(warm_start.get("sft_seed")),
        "warm_start_steps": as_seed(warm_start.get("steps")),
        "warm_start_target": as_float(warm_start.get("target_accuracy")),
        "warm_start_check": as_float(warm_start.get("check_accuracy")), "warm_start_reached": warm_start.get("reached"),
        "path": str(run_dir), "metrics_source": source, "included": not problems,
        "exclusion_reason": "; ".join(problems) if problems else None, "loadable": loadable,
        **flatten_config(config), "factors": axis_factors(meta.get("axes")),
    }


def add_run_columns(frame: pd.DataFrame, runs: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``frame`` (with ``sweep`` and ``run`` columns) with run-table ``columns`` joined on, to serve as group keys."""
    missing = [c for c in columns if c not in runs.columns]
    if missing:
        raise KeyError(f"columns {missing} are not in the run table; available: {list(runs.columns)}")
    wanted = [c for c in columns if c not in frame.columns]
    if not wanted:
        return frame
    lookup = runs[["sweep", "run", *wanted]].astype({"sweep": str, "run": str}).drop_duplicates(["sweep", "run"])
    joined = frame[["sweep", "run"]].astype(str).merge(lookup, on=["sweep", "run"], how="left")
    return frame.assign(**{column: joined[column].to_numpy() for column in wanted})


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


def _load_run_metrics(runs: pd.DataFrame, loadable: Sequence[bool], metrics: Sequence[str] | None,
                      include_incomplete: bool) -> dict[int, RunMetrics]:
    """Read the metrics of every run to be included; flags an unreadable run in ``runs`` (in place)."""
    loaded: dict[int, RunMetrics] = {}
    column = runs.columns.get_loc
    for position in range(len(runs)):
        row = runs.iloc[position]
        if not loadable[position] or not (row["included"] or include_incomplete):
            continue
        run_dir, errors = Path(row["path"]), []
        # a damaged parquet falls back to the jsonl it was compacted from, when that is still there; a completed
        # run's unreadable line excludes it, an unfinished run's torn last lines are skipped
        for attempt in ["parquet", "jsonl"] if row["metrics_source"] == "parquet" else ["jsonl"]:
            if run_store.metrics_source(run_dir) is None:
                break
            try:
                loaded[position] = read_run_metrics(run_dir, metrics, source=attempt,
                                                    skip_bad=row["state"] != run_store.COMPLETED)
                runs.iat[position, column("metrics_source")] = attempt
                break
            except FileNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - one damaged file must never stop a whole sweep
                errors.append(f"unreadable metrics.{attempt} ({type(exc).__name__}: {exc})")
        if position in loaded and loaded[position].nonfinite:
            runs.iat[position, column("nonfinite")] = "; ".join(
                f"{name} at step(s) {', '.join(map(str, steps[:5]))}{' ...' if len(steps) > 5 else ''}"
                for name, steps in loaded[position].nonfinite.items())
        reason = row["exclusion_reason"]
        runs.iat[position, column("included")] = position in loaded
        runs.iat[position, column("exclusion_reason")] = None if position in loaded else "; ".join(
            [*([reason] if isinstance(reason, str) and reason else []), *errors])
    return loaded


def load_runs(run_dirs: Sequence[str | os.PathLike[str]], *, metrics: Sequence[str] | None = None,
              include_incomplete: bool = False, histograms: bool = True,
              manifest: Mapping[str, Any] | None = None) -> SweepData:
    """Load run folders into :class:`SweepData`; ``manifest`` (``sweep.json``) adds its runs without a folder."""
    manifest = dict(manifest or {})
    listed_runs = manifest.get("runs")
    entries = {str(e["run"]): dict(e) for e in (listed_runs if isinstance(listed_runs, list) else [])
               if isinstance(e, Mapping) and "run" in e}
    owner = manifest.get("sweep") if isinstance(listed_runs, list) else None
    rows = [describe_run(run_dir, entries, owner) for run_dir in run_dirs]
    counts = Counter((row["sweep"], row["run"]) for row in rows)
    duplicates = sorted(f"{sweep}/{run}" for (sweep, run), count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"run folders with the same (sweep, run) identity: {duplicates}; load them separately")
    sweep_name = str(manifest.get("sweep") or (rows[0]["sweep"] if rows else ""))
    listed = {row["run"] for row in rows}
    rows += [_missing_run_row(sweep_name, entry) for name, entry in entries.items() if name not in listed]
    loadable = [bool(row.pop("loadable")) for row in rows]
    runs = make_run_table(rows, pop_factors(rows))
    check_arm_values(runs)
    long = build_long_table(runs, _load_run_metrics(runs, loadable, metrics, include_incomplete))
    return SweepData(runs=runs, metrics=long,
                     histograms=load_histograms(runs) if histograms else histogram_table(),
                     manifest=manifest or None,
                     source=", ".join(str(p) for p in run_dirs[:3]) + (" ..." if len(run_dirs) > 3 else ""))


def load_sweep(sweep_dir: str | os.PathLike[str], *, metrics: Sequence[str] | None = None,
               include_incomplete: bool = False, histograms: bool = True, require_runs: bool = False) -> SweepData:
    """Load a sweep folder ``runs/<sweep>/`` (``require_runs``: raise :class:`NoRunStoreError` when it has no run)."""
    sweep_dir = Path(sweep_dir)
    try:
        manifest = run_store.read_sweep_record(sweep_dir)
    except ValueError as exc:  # sweep.json is optional extra information
        logger.warning("ignoring unreadable sweep.json: %s", exc)
        manifest = None
    run_dirs = find_run_dirs(sweep_dir)
    if require_runs and not run_dirs:
        raise NoRunStoreError(
            f"{sweep_dir} holds no run store: expected a sweep folder (runs/<sweep>/ with one <run>/meta.json per run, "
            f"as python -m sweeps writes it) or a run folder (holding meta.json, as python -m dataflex_rl.local.train "
            f"writes it)"
        )
    return dataclasses.replace(load_runs(run_dirs, metrics=metrics, include_incomplete=include_incomplete,
                                         histograms=histograms, manifest=manifest), source=str(sweep_dir))


def resolve_sweep_dir(path: str | os.PathLike[str] | None = None, *, start: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$DATAFLEX_SWEEP_DIR``, else ``runs/latest`` or the newest sweep of the nearest ``runs/``."""
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
            if candidates:  # the sweep modified last
                return max(candidates, key=lambda sweep: max(
                    p.stat().st_mtime for p in (sweep / run_store.SWEEP_FILE, *sweep.glob(meta_glob)) if p.exists()))
    raise FileNotFoundError(f"no sweep found: set {SWEEP_DIR_ENV}=runs/<sweep> or run from a folder under which "
                            f"runs/<sweep>/<run>/meta.json exists (searched up from {here})")


def _histogram_frame(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """Histogram rows with numpy edges and counts, sorted by (name, step); inconsistent rows dropped."""
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


def load_histograms(runs: pd.DataFrame) -> pd.DataFrame:
    """The histogram table of the included runs of a run table."""
    factors = factor_columns(runs)
    records = []
    for _, row in runs[runs["included"] & runs["path"].notna()].iterrows():
        run_dir = Path(row["path"])
        try:
            frame = _histogram_frame(run_store.load_histograms(run_dir), str(run_dir))
        except Exception as exc:  # noqa: BLE001 - histograms are optional; never fail a sweep over them
            logger.warning("ignoring unreadable histograms of %s: %s", run_dir, exc)
            continue
        labels = {column: row[column] for column in (*IDENTITY_COLUMNS, *factors)}
        records += [{**labels, **record} for record in frame.to_dict("records")]
    return histogram_table(records, factors)
