"""The run store: one folder per run, the source of truth for local analysis (format: ``docs/run_store.md``).

Files written here::

    config.yaml          resolved config                                  atomic, at start
    meta.json            identity, versions, host, start/end time         atomic, at start and at close
    status.json          {"state", "step", "updated", "error", "traceback"} atomic, at every state change
    metrics.jsonl        {"step": int, "<key>": float, ...} one line per step, written with one write(2) each
    histograms.jsonl     {"step", "name", "edges": [k+1], "counts": [k]} one line per histogram
    metrics.parquet      wide: step int64, one float64 column per key (sorted), one row per step   at close
    histograms.parquet   long: step int64, name str, edges list<float64>, counts list<int64>      at close

Non-finite numbers: the jsonl files use Python's JSON extension tokens ``NaN``, ``Infinity`` and ``-Infinity``
(``json.dumps(allow_nan=True)``), so NaN, +inf and -inf round-trip exactly through ``json.loads``; readers other than
Python's ``json`` module may refuse these tokens, so read the jsonl with :func:`read_jsonl` or ``json.loads``. In the
parquet files they are IEEE NaN/inf; a key missing at a step is a null (pandas shows both as NaN).

A line reaches the operating system (``write(2)``) before ``log_metrics`` returns, so a killed process loses nothing
already logged; it is not fsync'ed (only a machine crash can lose the last lines; see ``benchmarks/bench_tracking.py``
for the cost of fsync).

Other modules read a store through the reader API here (:func:`read_status`, :func:`read_meta`,
:func:`read_config`, :func:`read_metrics`, :func:`read_curve`, :func:`final_value`, :func:`load_histograms`,
:func:`metrics_source`, :func:`is_run_store`, :data:`STATES`), never by file name. Also here: the config
fingerprint (:func:`config_fingerprint`, :func:`check_resume`), the one-writer lock (:class:`RunLock`) and the file
mode of everything written (:func:`file_mode`: 0666 less the umask, 0644 under the usual umask 022).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import fnmatch
import hashlib
import importlib.metadata
import itertools
import json
import logging
import numbers
import os
import pathlib
import platform
import socket
import tempfile
import traceback as traceback_module
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from dataflex_rl.validation import ConfigError, to_plain
from dataflex_rl.tracking.base import check_close_state
from dataflex_rl.tracking.identity import RunIdentity

LOG = logging.getLogger(__name__)
try:  # the C loader parses a resolved config ~10x faster; PyYAML ships it in its wheels
    _YAML_LOADER: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _YAML_LOADER = yaml.SafeLoader

CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
STATUS_FILE = "status.json"
METRICS_JSONL = "metrics.jsonl"
METRICS_PARQUET = "metrics.parquet"
HISTOGRAMS_JSONL = "histograms.jsonl"
HISTOGRAMS_PARQUET = "histograms.parquet"

LOCK_FILE = ".run.lock"
RESERVE_FILE = ".status.reserve"
CHECKPOINT_DIR = "checkpoints"

PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED = "pending", "running", "completed", "failed", "interrupted"
STATES = (PENDING, RUNNING, COMPLETED, FAILED, INTERRUPTED)
# Bytes kept on disk while a run is open, given back to record a failure when the disk is full.
RESERVE_BYTES = 256 * 1024
# A traceback longer than this is cut (its end is kept) when the full one cannot be written.
SHORT_TRACEBACK_CHARS = 4000
HISTOGRAM_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("name", pa.string()),
        ("edges", pa.list_(pa.float64())),
        ("counts", pa.list_(pa.int64())),
    ]
)
# meta.json keys written by the store itself; ``write_meta(extra=...)`` may not override them.
_RESERVED_META_KEYS = frozenset(
    {"versions", "host", "start_time", "end_time", "wall_time_s", "resume_times", "config_fingerprint"}
    | {field for field in RunIdentity.__dataclass_fields__}
)
_VERSIONED_DISTRIBUTIONS = {
    "torch": "torch",
    "transformers": "transformers",
    "verl": "verl",
    "dataflex_rl": "dataflex-rl",
}


# --- small helpers -----------------------------------------------------------------------------------------
def utc_now() -> str:
    """Current time, ISO 8601 in UTC with milliseconds (``2026-01-31T12:00:00.123+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value)


def _dumps_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, allow_nan=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to a hidden temp file beside ``path``, fsync it, then ``os.replace`` it onto ``path``.

    A reader sees the old content or the new one, never a mix; on any error the temp file is removed.
    """
    with _atomic_target(path) as temporary, open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write_json(path: pathlib.Path, obj: Any) -> None:
    """Pretty JSON (``allow_nan``) written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, allow_nan=True, ensure_ascii=False) + "\n").encode("utf-8"))


def _current_umask() -> int:
    """The process umask, read without changing it where the OS allows (``/proc``); else set and restored."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as handle:
            line = next(line for line in handle if line.startswith("Umask:"))
        return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of every file the store writes: ``0o666`` less the umask (``0o644`` under the usual umask 022).

    ``tempfile.mkstemp`` creates ``0o600`` files, which the rename would carry onto a shared filesystem where
    teammates could not read them; the atomic writers set this mode before the rename.
    """
    return 0o666 & ~_current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a hidden temp path beside ``path`` (``.<name>.<random>.tmp``, mode :func:`file_mode`); on success it
    is renamed onto ``path``, on any error (a full disk included) it is deleted. For writers that need a path
    (``torch.save``, ``pyarrow``)."""
    with _atomic_target(pathlib.Path(path)) as temporary:
        yield temporary


@contextlib.contextmanager
def _atomic_target(path: pathlib.Path) -> Iterator[str]:
    """Yield a temp path in ``path``'s folder; on success rename it onto ``path``, on error delete it."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(descriptor, file_mode())
    finally:
        os.close(descriptor)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _package_versions() -> dict[str, str | None]:
    """Versions from installed package metadata: no package is imported (cheap even for torch and verl)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _VERSIONED_DISTRIBUTIONS.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step = {step!r} is not allowed: it must be an integer >= 0")
    return int(step)


def _as_list(values: Any) -> list:
    """A plain list from a list, tuple, numpy array or torch tensor (``tolist`` avoids per-element conversion)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


# --- jsonl reading -----------------------------------------------------------------------------------------
class RunStoreError(ValueError):
    """A run-store file that exists but cannot be read; the message names the file and what is wrong."""


def read_jsonl(path: str | os.PathLike[str], *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """Records of a run-store jsonl file; a partial last line (left by a hard kill) is dropped with a warning.

    Raises :class:`RunStoreError` (a ``ValueError``) naming the file and line for a corrupt line elsewhere, or, with
    ``skip_bad``, skips such lines with one warning (analysis: one bad line must not hide a run). A missing file
    gives ``[]``.
    """
    records, _ = _read_jsonl_with_tail(pathlib.Path(path), skip_bad=skip_bad)
    return records


def _read_jsonl_with_tail(path: pathlib.Path, skip_bad: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether a partial last line was dropped)."""
    if not path.exists():
        return [], False
    data = path.read_bytes()
    lines = data.split(b"\n")
    # ``data`` ending in "\n" leaves an empty last element; anything else there is a line without its newline.
    tail = lines.pop()
    records = []
    bad_lines = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse_record(line)
        if record is None:
            if not skip_bad:
                raise RunStoreError(f"{path}: line {number} is not a run-store record: {line[:200]!r}")
            bad_lines.append(number)
            continue
        records.append(record)
    if bad_lines:
        LOG.warning("%s: skipped %d unreadable line(s): %s", path, len(bad_lines), bad_lines[:5])
    dropped = False
    if tail.strip():
        record = _parse_record(tail)
        if record is None:
            LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(tail))
            dropped = True
        else:
            records.append(record)
    return records, dropped


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    return record


def _repair_tail(path: pathlib.Path) -> None:
    """Make ``path`` end with a newline before appending: cut a partial last line, or end a complete one."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if _parse_record(data[cut:]) is not None:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")
        else:
            LOG.warning(
                "%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(data) - cut
            )
            handle.truncate(cut)


# --- tables ------------------------------------------------------------------------------------------------
def _duplicates_warning(what: str, path_hint: str, duplicates: list[Any]) -> None:
    shown = ", ".join(map(str, duplicates[:5])) + (" ..." if len(duplicates) > 5 else "")
    LOG.warning(
        "%s: %d %s appear more than once (%s); the last value of each key is kept",
        path_hint,
        len(duplicates),
        what,
        shown,
    )


def metrics_table(records: Sequence[Mapping[str, Any]], source: str = "metrics") -> pa.Table:
    """Wide table from metric records: ``step`` (int64) then one float64 column per key in sorted order.

    One row per step, sorted by step. A key absent at a step is null. A step held by several records is merged,
    later values winning, with a warning (the store writes each step once).
    """
    rows: dict[int, dict[str, float]] = {}
    duplicates = []
    for record in records:
        step = record["step"]
        if step in rows:
            duplicates.append(step)
            rows[step].update((key, value) for key, value in record.items() if key != "step")
        else:
            rows[step] = {key: value for key, value in record.items() if key != "step"}
    if duplicates:
        _duplicates_warning("steps", source, duplicates)
    steps = sorted(rows)
    keys = sorted({key for row in rows.values() for key in row})
    columns = {"step": pa.array(steps, type=pa.int64())}
    for key in keys:
        values = [rows[step].get(key) for step in steps]
        columns[key] = pa.array([None if value is None else float(value) for value in values], type=pa.float64())
    return pa.table(columns)


def histograms_table(records: Sequence[Mapping[str, Any]], source: str = "histograms") -> pa.Table:
    """Long table ``step, name, edges, counts`` (:data:`HISTOGRAM_SCHEMA`) sorted by (step, name); last one wins."""
    latest: dict[tuple[int, str], Mapping[str, Any]] = {}
    duplicates = []
    for record in records:
        key = (record["step"], record["name"])
        if key in latest:
            duplicates.append(key)
        latest[key] = record
    if duplicates:
        _duplicates_warning("(step, name) pairs", source, duplicates)
    ordered = [latest[key] for key in sorted(latest)]
    return pa.table(
        {
            "step": [record["step"] for record in ordered],
            "name": [record["name"] for record in ordered],
            "edges": [[float(edge) for edge in record["edges"]] for record in ordered],
            "counts": [[int(count) for count in record["counts"]] for record in ordered],
        },
        schema=HISTOGRAM_SCHEMA,
    )


def _write_parquet(path: pathlib.Path, table: pa.Table) -> None:
    with _atomic_target(path) as temporary:
        pq.write_table(table, temporary)


def load_metrics(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Wide metrics frame of a run (``step`` then one column per key): ``metrics.parquet``, else ``metrics.jsonl``.

    Both sources give the same frame. An open or crashed run has only the jsonl. Missing values and NaN are NaN.
    """
    run_dir = pathlib.Path(run_dir)
    parquet = run_dir / METRICS_PARQUET
    if parquet.exists():
        return pq.read_table(parquet).to_pandas()
    return metrics_table(read_jsonl(run_dir / METRICS_JSONL), source=str(run_dir / METRICS_JSONL)).to_pandas()


def load_histograms(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Histogram frame (``step, name, edges, counts``): ``histograms.parquet``, else ``histograms.jsonl``."""
    run_dir = pathlib.Path(run_dir)
    parquet = run_dir / HISTOGRAMS_PARQUET
    if parquet.exists():
        return pq.read_table(parquet).to_pandas()
    path = run_dir / HISTOGRAMS_JSONL
    return histograms_table(read_jsonl(path), source=str(path)).to_pandas()


def _tolerant(reader: Any, run_dir: pathlib.Path) -> Any:
    """``reader(run_dir)``, or None when the file is damaged (logged): for writers that must not fail on it."""
    try:
        return reader(run_dir)
    except (RunStoreError, OSError) as error:
        LOG.warning("%s", error)
        return None


def _shortened(status: Mapping[str, Any], limit: int = SHORT_TRACEBACK_CHARS) -> dict[str, Any]:
    """``status`` with its traceback and error cut to their last ``limit`` characters (the end names the cause)."""
    result = dict(status)
    for key in ("traceback", "error"):
        text = result.get(key)
        if isinstance(text, str) and len(text) > limit:
            result[key] = "...(cut)\n" + text[-limit:]
    return result


def _overwrite_in_place(path: pathlib.Path, obj: Mapping[str, Any]) -> None:
    """Last resort on a full disk: write over the existing file's blocks (not atomic; a reader may see a mix
    for an instant), then cut it to length."""
    data = (json.dumps(obj, indent=2, allow_nan=True, ensure_ascii=False) + "\n").encode("utf-8")
    descriptor = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(descriptor, data, 0)
        os.ftruncate(descriptor, len(data))
    finally:
        os.close(descriptor)


# --- the reader API ----------------------------------------------------------------------------------------
def is_run_store(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a run folder (it holds ``meta.json``, written when a run starts)."""
    return (pathlib.Path(path) / META_FILE).is_file()


def _read_json_file(path: pathlib.Path) -> dict[str, Any] | None:
    """A JSON object file, None when absent; :class:`RunStoreError` naming the file when it cannot be parsed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise RunStoreError(f"{path} cannot be read: {error}") from error
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise RunStoreError(f"{path} is not valid JSON ({error}); it may have been cut short") from error
    if not isinstance(payload, dict):
        raise RunStoreError(f"{path} holds a {type(payload).__name__}, expected a JSON object")
    return payload


def read_status(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``status.json`` of a run: ``{"state", "step", "updated", "error", "traceback"}``; None before the run started.

    ``state`` is one of :data:`STATES`. Raises :class:`RunStoreError` naming the file when it is damaged.
    """
    return _read_json_file(pathlib.Path(run_dir) / STATUS_FILE)


def read_meta(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``meta.json`` of a run (identity, fingerprint, versions, host, times); None when absent."""
    return _read_json_file(pathlib.Path(run_dir) / META_FILE)


def read_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The resolved config of a run (``config.yaml``); None when absent, :class:`RunStoreError` when damaged."""
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
    run_dir = pathlib.Path(run_dir)
    if (run_dir / METRICS_PARQUET).is_file():
        return "parquet"
    if (run_dir / METRICS_JSONL).is_file():
        return "jsonl"
    return None


def read_metrics(
    run_dir: str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    *,
    source: str | None = None,
    skip_bad: bool = False,
) -> pd.DataFrame:
    """Wide metrics frame of a run: ``step`` (int64, sorted, unique) then one float64 column per key.

    ``keys``: the metric columns wanted, exact keys or ``fnmatch`` globs (None: all; a key the run never logged is
    left out; a value that is not a number reads as missing). ``source``:
    ``"parquet"`` or ``"jsonl"`` (default: :func:`metrics_source`). ``skip_bad``: skip corrupt jsonl lines with a
    warning instead of raising. A run without metrics gives a frame with only ``step``.
    """
    run_dir = pathlib.Path(run_dir)
    source = source or metrics_source(run_dir)
    path = run_dir / (METRICS_PARQUET if source == "parquet" else METRICS_JSONL)
    if source is not None and not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    if source == "parquet":
        names = [name for name in pq.read_schema(path).names if name != "step"]
        frame = pq.read_table(path, columns=["step", *_select_keys(names, keys)]).to_pandas()
    elif source == "jsonl":
        records = read_jsonl(path, skip_bad=skip_bad)
        names = sorted({key for record in records for key in record if key != "step"})
        wanted = set(_select_keys(names, keys))
        records = [{"step": record["step"], **{k: _number_or_none(v) for k, v in record.items() if k in wanted}}
                   for record in records]
        frame = metrics_table(records, source=str(path)).to_pandas()
    elif source is None:
        return pd.DataFrame({"step": pd.Series(dtype="int64")})
    else:
        raise ValueError(f"source = {source!r} is not allowed: use 'parquet', 'jsonl' or None")
    if len(frame) > 1 and not frame["step"].is_monotonic_increasing:
        frame = frame.sort_values("step", kind="stable").drop_duplicates("step", keep="last")
    return frame.reset_index(drop=True)


def _select_keys(names: Sequence[str], patterns: Sequence[str] | None) -> list[str]:
    """``names`` matching any of ``patterns`` (exact keys or ``fnmatch`` globs such as ``grad_norm/by_prob/*``)."""
    if patterns is None:
        return list(names)
    exact = set(patterns)
    globs = [pattern for pattern in patterns if any(char in pattern for char in "*?[")]
    return [name for name in names if name in exact or any(fnmatch.fnmatchcase(name, g) for g in globs)]


def _number_or_none(value: Any) -> float | None:
    """A logged value as a float; anything else (text written by a foreign tool) becomes a missing value."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def read_curve(run_dir: str | os.PathLike[str], key: str, *, skip_bad: bool = False) -> pd.Series:
    """``step -> value`` of one metric, the steps where it was logged with a finite value, in step order.

    Empty when the run never logged ``key`` (or logged nothing yet); readable while the run is going.
    """
    frame = read_metrics(run_dir, [key], skip_bad=skip_bad)
    if key not in frame.columns:
        return pd.Series(dtype="float64", name=key, index=pd.Index([], dtype="int64", name="step"))
    curve = pd.Series(frame[key].to_numpy(dtype="float64"), index=pd.Index(frame["step"], name="step"), name=key)
    return curve[curve.notna() & (curve.abs() != float("inf"))]


def final_value(run_dir: str | os.PathLike[str], key: str, *, skip_bad: bool = True) -> float | None:
    """The last finite logged value of ``key``, or None (never logged, no metrics yet)."""
    curve = read_curve(run_dir, key, skip_bad=skip_bad)
    return float(curve.iloc[-1]) if len(curve) else None


def histogram_names(run_dir: str | os.PathLike[str]) -> list[str]:
    """The names of the histograms a run logged, sorted."""
    return sorted(set(load_histograms(run_dir)["name"].astype(str)))


# --- the config fingerprint --------------------------------------------------------------------------------
# Config keys (dotted prefixes) that cannot change a run's numbers: where its logs go, how many threads compute them
# (threads may change the last bits of float reductions, not the results), where the run folder and the SFT cache
# sit (the cache is keyed by its content).
FINGERPRINT_IGNORED: tuple[str, ...] = ("logger", "threads", "run_dir", "sft.cache_dir")
# Keys that may grow on resume: extending a run continues the same trajectory.
FINGERPRINT_GROWING: tuple[str, ...] = ("trainer.total_steps",)
_FINGERPRINT_LENGTH = 16


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> ``{"a.b.c": value}`` (lists stay values)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def _matches(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in prefixes)


def _numbers_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened config minus :data:`FINGERPRINT_IGNORED` and :data:`FINGERPRINT_GROWING` keys."""
    flat = flatten_config(to_plain(config))
    return {k: v for k, v in flat.items() if not _matches(k, FINGERPRINT_IGNORED + FINGERPRINT_GROWING)}


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """16 hex digits of sha256 over the keys of ``config`` that can change a run's numbers (canonical JSON).

    Two configs with the same fingerprint may differ only in :data:`FINGERPRINT_IGNORED` keys and in
    :data:`FINGERPRINT_GROWING` keys.
    """
    canonical = json.dumps(_numbers_config(config), sort_keys=True, separators=(",", ":"), default=str,
                           allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:_FINGERPRINT_LENGTH]


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old value, new value)`` for every key that may not differ on resume, sorted by key.

    A key present on one side only shows the other side as ``"<absent>"``. A growing key may grow, never shrink.
    """
    absent = "<absent>"
    old_flat, new_flat = flatten_config(to_plain(old)), flatten_config(to_plain(new))
    differences = []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        before, after = old_flat.get(key, absent), new_flat.get(key, absent)
        if before == after or _matches(key, FINGERPRINT_IGNORED):
            continue
        if _matches(key, FINGERPRINT_GROWING) and _grows(before, after):
            continue
        differences.append((key, before, after))
    return differences


def _grows(before: Any, after: Any) -> bool:
    numbers_only = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in (before, after))
    return numbers_only and after >= before


class ConfigMismatchError(ConfigError):
    """A resume (or a sweep rerun) with a config whose numbers-relevant keys differ from the recorded one."""


def check_resume(run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
    """Refuse to continue the run in ``run_dir`` with ``config`` when they differ in a key that changes numbers.

    Compares with the recorded ``config.yaml``: nothing to compare (a fresh folder) passes. A store written before
    fingerprints existed (no ``config_fingerprint`` in ``meta.json``) only gets a warning. Raises
    :class:`ConfigMismatchError` naming every differing key with its recorded and its new value.
    """
    recorded = read_config(run_dir)
    if recorded is None:
        return
    differences = config_differences(recorded, config)
    if not differences:
        return
    listed = "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differences)
    if "config_fingerprint" not in (read_meta(run_dir) or {}):
        LOG.warning("%s was written before config fingerprints; resuming it although its config differs: %s",
                    run_dir, listed)
        return
    raise ConfigMismatchError(
        f"run {run_dir} was recorded with a different config: {listed}. Only {', '.join(FINGERPRINT_IGNORED)} may "
        f"differ, and {', '.join(FINGERPRINT_GROWING)} may grow; use the recorded values, or a new run_dir for the "
        f"new config (or delete {run_dir} to start it again)"
    )


# --- one writer per run ------------------------------------------------------------------------------------
class RunLockedError(ConfigError):
    """Another live process holds the run's lock."""


class RunLock:
    """An exclusive ``flock`` on ``<run_dir>/.run.lock``, held for the writer's life; the file holds its pid.

    The kernel releases the lock when the holder dies (even by SIGKILL), so a stale lock file never blocks a
    resume. Use as a context manager or call :meth:`acquire` / :meth:`release`.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(run_dir) / LOCK_FILE
        self._descriptor: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` naming the holder's pid; never waits."""
        if self._descriptor is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, file_mode())
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(descriptor)
            raise RunLockedError(
                f"run {self.path.parent} is being written by another process (pid {holder}); one writer per run: "
                f"wait for it or stop it"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode("ascii"), 0)
        self._descriptor = descriptor
        return self

    def release(self) -> None:
        """Give the lock up (the file stays; it is only a lock)."""
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def remove_stale_temporaries(run_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp files an interrupted write left in the run folder and its ``checkpoints/`` (names returned).

    Call only while holding the run's :class:`RunLock`: then no writer can be using them.
    """
    run_dir = pathlib.Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CHECKPOINT_DIR):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            # ``.<name>.<random>.tmp`` from the atomic writers; ``<name>.tmp<pid>`` from older checkpoint writers.
            stale = (path.name.startswith(".") and path.name.endswith(".tmp")) or ".tmp" in path.suffix
            if stale and path.is_file():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                removed.append(path.name)
    if removed:
        LOG.info("%s: removed temp files left by an interrupted write: %s", run_dir, ", ".join(removed))
    return removed


# --- the store ---------------------------------------------------------------------------------------------
class RunStore:
    """One run's folder. Also a :class:`~dataflex_rl.tracking.base.Logger` (config, metrics, histograms, close).

    Open it, then on resume from a checkpoint at step ``s`` call :meth:`truncate_after` before logging step
    ``s + 1``. Appending after a hard kill is safe without it too: a partial last line is cut before the first
    append. A writer that may share the folder with another process takes :meth:`lock` first.

    A failure is always recorded (``record_error``, ``close("failed")``): from what the store holds in memory,
    never by re-reading its files, and with a small reserve file given back when the disk is full.
    """

    name = "run_store"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._handles: dict[str, BinaryIO] = {}
        self._last_metrics_step: int | None = None
        self._warned_order = False
        self._closed = False
        self._status: dict[str, Any] | None = None  # the last status this object wrote
        self._fingerprint: str | None = None

    def path(self, file_name: str) -> pathlib.Path:
        """``<run_dir>/<file_name>``."""
        return self.run_dir / file_name

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (its status is then final)."""
        return self._closed

    def lock(self) -> RunLock:
        """The run's :class:`RunLock` (acquired): one writer per run. Release it (or use ``with``) when done."""
        return RunLock(self.run_dir).acquire()

    # --- config, meta, status ------------------------------------------------------------------------------
    def write_config(self, config: Mapping[str, Any]) -> None:
        """``config.yaml``: the resolved config, keys in their given order; its :func:`config_fingerprint` goes
        into ``meta.json`` (now, when meta exists, else with the next :meth:`write_meta`)."""
        plain = to_plain(config)
        text = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, allow_unicode=True)
        atomic_write_bytes(self.path(CONFIG_FILE), text.encode("utf-8"))
        self._fingerprint = config_fingerprint(plain)
        meta = _tolerant(read_meta, self.run_dir)
        if meta is not None and meta.get("config_fingerprint") != self._fingerprint:
            meta["config_fingerprint"] = self._fingerprint
            atomic_write_json(self.path(META_FILE), meta)

    def read_config(self) -> dict[str, Any] | None:
        """See :func:`read_config`."""
        return read_config(self.run_dir)

    def write_meta(
        self, identity: RunIdentity, extra: Mapping[str, Any] | None = None, *, now: str | None = None
    ) -> dict[str, Any]:
        """``meta.json`` at the start of a (possibly resumed) session; returns what was written.

        A resumed run keeps its first ``start_time`` and appends the session start to ``resume_times``.
        ``end_time`` and ``wall_time_s`` are null until :meth:`close`, which sets
        ``wall_time_s = end_time - start_time`` (for a resumed run, including the time between sessions).
        ``now``: the session's start time (ISO 8601), default the current time. ``config_fingerprint`` is that of
        the config written by :meth:`write_config` (this session's, else the recorded one).
        """
        extra = dict(extra or {})
        clashing = sorted(_RESERVED_META_KEYS & extra.keys())
        if clashing:
            raise ValueError(
                f"write_meta extra keys {clashing} are reserved; reserved keys: {sorted(_RESERVED_META_KEYS)}"
            )
        now = now or utc_now()
        previous = self.read_meta() or {}
        fingerprint = self._fingerprint or previous.get("config_fingerprint")
        if fingerprint is None:
            recorded = _tolerant(read_config, self.run_dir)
            fingerprint = config_fingerprint(recorded) if recorded is not None else None
        meta: dict[str, Any] = {
            **identity.to_dict(),
            "config_fingerprint": fingerprint,
            "versions": _package_versions(),
            "host": socket.gethostname(),
            "start_time": previous.get("start_time", now),
            "end_time": None,
            "wall_time_s": None,
        }
        if "start_time" in previous:
            meta["resume_times"] = [*previous.get("resume_times", []), now]
        meta.update(extra)
        atomic_write_json(self.path(META_FILE), meta)
        return meta

    def read_meta(self) -> dict[str, Any] | None:
        """See :func:`read_meta`."""
        return read_meta(self.run_dir)

    def set_status(
        self, state: str, step: int | None = None, error: str | None = None, traceback: str | None = None
    ) -> dict[str, Any]:
        """Write ``status.json``; ``step`` None keeps the previous status's step (0 at first).

        ``failed`` and ``interrupted`` are written even on a full disk (see :meth:`record_error`); ``running``
        keeps a small reserve file on disk for that.
        """
        if state not in STATES:
            raise ValueError(f"status state {state!r} is not allowed; allowed states: {', '.join(STATES)}")
        if step is None:
            previous = self._status if self._status is not None else _tolerant(read_status, self.run_dir)
            step = (previous or {}).get("step", 0)
        status = {
            "state": state,
            "step": _check_step(step),
            "updated": utc_now(),
            "error": error,
            "traceback": traceback,
        }
        if state in (FAILED, INTERRUPTED):
            self._write_status_reliably(status)
        else:
            atomic_write_json(self.path(STATUS_FILE), status)
            if state == RUNNING:
                self._keep_reserve()
        self._status = status
        return status

    def read_status(self) -> dict[str, Any] | None:
        """See :func:`read_status`."""
        return read_status(self.run_dir)

    def record_error(self, state: str, error: str, traceback: str | None = None) -> None:
        """Status ``state`` with the error message and traceback; a later ``close(state)`` keeps them.

        Reads nothing from the store (its files may be what failed) and needs no free space.
        """
        self.set_status(state, step=self._known_step(), error=error, traceback=traceback)

    def _known_step(self) -> int:
        """The last step this process logged, else the last status step it wrote, else 0: from memory only."""
        if self._last_metrics_step is not None:
            return self._last_metrics_step
        return int((self._status or {}).get("step", 0))

    def _keep_reserve(self) -> None:
        """Keep :data:`RESERVE_BYTES` allocated in the run folder while the run is open (best effort)."""
        path = self.path(RESERVE_FILE)
        if path.exists():
            return
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, file_mode())
            try:
                os.posix_fallocate(descriptor, 0, RESERVE_BYTES)
            finally:
                os.close(descriptor)
        except (OSError, AttributeError) as error:  # no space or no fallocate: the failure path still tries
            LOG.debug("%s: no space reserve (%s)", self.run_dir, error)
            with contextlib.suppress(OSError):
                path.unlink()

    def _release_reserve(self) -> bool:
        try:
            self.path(RESERVE_FILE).unlink()
        except FileNotFoundError:
            return False
        return True

    def _write_status_reliably(self, status: dict[str, Any]) -> None:
        """``status.json`` however full the disk: give back the reserve, then cut the traceback to its end, then
        overwrite the old file in place (no new blocks needed). Raises only if every attempt failed."""
        attempts = [
            lambda: atomic_write_json(self.path(STATUS_FILE), status),
            lambda: self._release_reserve() and atomic_write_json(self.path(STATUS_FILE), status),
            lambda: atomic_write_json(self.path(STATUS_FILE), _shortened(status)),
            lambda: _overwrite_in_place(self.path(STATUS_FILE), _shortened(status, 400)),
        ]
        last_error: OSError | None = None
        for attempt in attempts:
            try:
                if attempt() is not False:
                    return
            except OSError as error:
                last_error = error
                LOG.warning("%s: writing status %s failed (%s); trying again", self.run_dir, status["state"], error)
        if last_error is not None:
            raise last_error

    # --- Logger protocol -----------------------------------------------------------------------------------
    def log_config(self, config: dict) -> None:
        """Write ``config.yaml`` (see :meth:`write_config`)."""
        self.write_config(config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append ``{"step": step, **metrics}`` to ``metrics.jsonl`` (one ``write(2)``); values become floats."""
        step = _check_step(step)
        record: dict[str, Any] = {"step": step}
        for key, value in metrics.items():
            if not isinstance(key, str) or key == "step":
                raise ValueError(f"metric key {key!r} is not allowed: keys are strings other than 'step'")
            try:
                record[key] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"metric {key!r} at step {step} = {value!r} is not a number") from None
        if self._last_metrics_step is not None and step <= self._last_metrics_step and not self._warned_order:
            self._warned_order = True
            LOG.warning(
                "log_metrics: step %d after step %d; each step should be logged once, in increasing order "
                "(compaction keeps the last value of each key)",
                step,
                self._last_metrics_step,
            )
        self._last_metrics_step = step
        self._append(METRICS_JSONL, METRICS_PARQUET, record)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Append one histogram to ``histograms.jsonl``: ``k + 1`` increasing edges, ``k`` integer counts >= 0."""
        step = _check_step(step)
        if not isinstance(name, str) or not name:
            raise ValueError(f"histogram name {name!r} is not allowed: it must be a non-empty string")
        edge_values = [float(edge) for edge in _as_list(edges)]
        raw_counts = _as_list(counts)
        if len(edge_values) != len(raw_counts) + 1 or not raw_counts:
            raise ValueError(
                f"histogram {name!r} at step {step}: got {len(edge_values)} edges and {len(raw_counts)} counts; "
                f"k >= 1 bins need k + 1 edges"
            )
        if any(not left < right for left, right in itertools.pairwise(edge_values)):
            raise ValueError(f"histogram {name!r} at step {step}: edges must be strictly increasing, got {edge_values}")
        count_values = []
        for count in raw_counts:
            number = float(count)
            if not (number >= 0 and number.is_integer()):
                raise ValueError(f"histogram {name!r} at step {step}: count {count!r} is not an integer >= 0")
            count_values.append(int(number))
        self._append(
            HISTOGRAMS_JSONL,
            HISTOGRAMS_PARQUET,
            {"step": step, "name": name, "edges": edge_values, "counts": count_values},
        )

    def close(self, state: str = "completed", *, end_time: str | None = None) -> None:
        """Compact the jsonl files to parquet, stamp ``end_time``/``wall_time_s`` in meta, set the final status.

        The jsonl files stay (a later resume appends to them). If the status already holds ``state`` with an
        error (from :meth:`record_error`), the error and traceback are kept. A second call does nothing.
        Closing as ``failed`` or ``interrupted`` always writes the status, even when the files cannot be read;
        closing as ``completed`` when they cannot be compacted records ``failed`` and raises. ``end_time``:
        ISO 8601, default the current time.
        """
        check_close_state(state)
        if self._closed:
            return
        self._closed = True
        self._close_handles()
        last_step = None
        try:
            last_step = self.compact()
            self._stamp_end_time(end_time or utc_now())
        except Exception as error:
            if state == COMPLETED:
                self.set_status(FAILED, step=self._known_step(), error=f"{type(error).__name__}: {error}",
                                traceback=traceback_module.format_exc())
                self._release_reserve()
                raise
            LOG.warning("%s: could not compact the run store while closing it as %s (%s: %s)", self.run_dir,
                        state, type(error).__name__, error)
        current = self._status if self._status is not None else (_tolerant(read_status, self.run_dir) or {})
        same_state = current.get("state") == state
        step = last_step if last_step is not None else self._known_step() or current.get("step", 0)
        self.set_status(
            state,
            step=step,
            error=current.get("error") if same_state else None,
            traceback=current.get("traceback") if same_state else None,
        )
        self._release_reserve()

    def _stamp_end_time(self, end: str) -> None:
        meta = self.read_meta()
        if meta is not None:
            meta["end_time"] = end
            meta["wall_time_s"] = (_parse_time(end) - _parse_time(meta["start_time"])).total_seconds()
            atomic_write_json(self.path(META_FILE), meta)

    # --- files ---------------------------------------------------------------------------------------------
    def compact(self) -> int | None:
        """Write ``metrics.parquet`` and ``histograms.parquet`` from the jsonl files (empty tables if none).

        Returns the last metrics step (None when nothing was logged)."""
        metrics_path = self.path(METRICS_JSONL)
        table = metrics_table(read_jsonl(metrics_path), source=str(metrics_path))
        _write_parquet(self.path(METRICS_PARQUET), table)
        histograms_path = self.path(HISTOGRAMS_JSONL)
        _write_parquet(
            self.path(HISTOGRAMS_PARQUET), histograms_table(read_jsonl(histograms_path), source=str(histograms_path))
        )
        steps = table.column("step")
        return int(steps[len(steps) - 1].as_py()) if len(steps) else None

    def truncate_after(self, step: int) -> int:
        """Drop every line with ``step > step`` from both jsonl files (atomic rewrite); returns lines dropped.

        Used on resume from a checkpoint at ``step``, so a step is never held twice. A partial last line is
        dropped too. Stale parquet files are removed (they are rewritten at close).
        """
        step = _check_step(step)
        self._close_handles()
        dropped = 0
        for file_name, parquet_name in ((METRICS_JSONL, METRICS_PARQUET), (HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET)):
            path = self.path(file_name)
            with contextlib.suppress(FileNotFoundError):
                self.path(parquet_name).unlink()
            if not path.exists():
                continue
            records, partial = _read_jsonl_with_tail(path)
            kept = [record for record in records if record["step"] <= step]
            dropped += len(records) - len(kept)
            if len(kept) != len(records) or partial:
                atomic_write_bytes(path, b"".join(_dumps_line(record) for record in kept))
        self._last_metrics_step = None
        if dropped:
            LOG.info(
                "%s: dropped %d logged line(s) after step %d (resuming from step %d)", self.run_dir, dropped, step, step
            )
        return dropped

    def clear_logs(self) -> int:
        """Drop every metric and histogram line (a fresh start of a run whose earlier attempt died before its
        first checkpoint), so no step is held twice; returns lines dropped."""
        dropped = self.truncate_after(0)
        for file_name in (METRICS_JSONL, HISTOGRAMS_JSONL):
            path = self.path(file_name)
            if path.exists():
                dropped += len(read_jsonl(path))
                atomic_write_bytes(path, b"")
        return dropped

    def last_logged_step(self) -> int | None:
        """The largest step in ``metrics.jsonl``, or None when nothing was logged."""
        steps = [record["step"] for record in read_jsonl(self.path(METRICS_JSONL))]
        return max(steps) if steps else None

    def _append(self, file_name: str, parquet_name: str, record: Mapping[str, Any]) -> None:
        if self._closed:
            raise RuntimeError(f"run store {self.run_dir} is closed; open a new RunStore to log more")
        handle = self._handles.get(file_name)
        if handle is None:
            path = self.path(file_name)
            _repair_tail(path)
            # The parquet is a snapshot of the jsonl taken at close; once the jsonl grows it is stale.
            with contextlib.suppress(FileNotFoundError):
                self.path(parquet_name).unlink()
            # Unbuffered: each line is one write(2), visible to readers and safe from a process kill at once.
            handle = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close() / _close_handles()
            self._handles[file_name] = handle
        data = memoryview(_dumps_line(record))
        while data:  # a raw write may be short (signal, near-full disk): write the rest
            data = data[handle.write(data) :]

    def detach(self) -> None:
        """Close the open log files without closing the run: no compaction, no status (what a killed writer
        leaves behind; also for a writer handing the run to another process)."""
        self._close_handles()

    def _close_handles(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r})"
