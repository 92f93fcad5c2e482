"""The run store: one folder per run, the source of truth for local analysis (format: ``docs/run_store.md``).

One module per reason to change; import the names from here:

* :mod:`.files`: the file names, atomic writes (:func:`atomic_write_json`, :func:`atomic_path`), the file mode of
  everything written (:func:`file_mode`: 0666 less the umask), :class:`RunStoreError`;
* :mod:`.jsonl`: the ``metrics.jsonl`` / ``histograms.jsonl`` lines: appended, read (:func:`read_jsonl`), repaired;
* :mod:`.tables`: the parquet files compacted from them (:func:`metrics_table`, :data:`HISTOGRAM_SCHEMA`);
* :mod:`.reader`: the reader API every other module reads a store through, never by file name
  (:func:`read_status`, :func:`read_meta`, :func:`read_config`, :func:`read_sweep_record` (a sweep folder's
  ``sweep.json``), :func:`read_metrics`, :func:`read_curve`,
  :func:`final_value`, :func:`load_metrics`, :func:`load_histograms`, :func:`metrics_source`, :func:`is_run_store`, :func:`is_sweep_folder`, :func:`run_record_files`);
* :mod:`.fingerprint`: the config fingerprint and the resume policy (:func:`config_fingerprint`,
  :func:`check_resume`);
* :mod:`.lock`: one writer per run (:class:`RunLock`);
* :mod:`.status`: the run states (:data:`STATES`) and recording a failure on a full disk;
* :mod:`.meta`: what ``meta.json`` holds, the numeric environment included (:func:`numeric_environment`);
* :mod:`.writer`: :class:`RunStore`, which writes a run;
* :mod:`.verify`: whether a run folder's record can be trusted (:func:`verify_run`), the check the sweep driver and
  the analysis call before believing a run.

Layers, lowest first (each imports only those before it): ``files``; ``jsonl``, ``tables``, ``lock``, ``status``,
``meta``; ``reader``; ``fingerprint``; ``writer``, ``verify``.
"""

from dataflex_rl.tracking.run_store.files import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    HISTOGRAMS_JSONL,
    HISTOGRAMS_PARQUET,
    LOCK_FILE,
    META_FILE,
    METRICS_JSONL,
    METRICS_PARQUET,
    RESERVE_FILE,
    STATUS_FILE,
    SWEEP_FILE,
    RunStoreError,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    file_mode,
    read_json_object,
    remove_stale_temporaries,
    utc_now,
)
from dataflex_rl.tracking.run_store.fingerprint import (
    FINGERPRINT_GROWING,
    FINGERPRINT_IGNORED,
    ConfigMismatchError,
    check_resume,
    config_differences,
    config_fingerprint,
    flatten_config,
)
from dataflex_rl.tracking.run_store.jsonl import JsonlTail, read_jsonl
from dataflex_rl.tracking.run_store.lock import RunLock, RunLockedError
from dataflex_rl.tracking.run_store.meta import numeric_environment
from dataflex_rl.tracking.run_store.reader import (
    final_value,
    histogram_names,
    is_run_store,
    is_sweep_folder,
    load_histograms,
    load_metrics,
    metrics_source,
    read_config,
    read_curve,
    read_meta,
    read_metrics,
    read_status,
    read_sweep_record,
    run_record_files,
)
from dataflex_rl.tracking.run_store.status import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    PENDING,
    RESERVE_BYTES,
    RUNNING,
    SHORT_TRACEBACK_CHARS,
    STATES,
)
from dataflex_rl.tracking.run_store.tables import HISTOGRAM_SCHEMA, histograms_table, metrics_table
from dataflex_rl.tracking.run_store.verify import config_identity, identity_differences, verify_run
from dataflex_rl.tracking.run_store.writer import RunStore

__all__ = [
    "CHECKPOINT_DIR",
    "COMPLETED",
    "CONFIG_FILE",
    "FAILED",
    "FINGERPRINT_GROWING",
    "FINGERPRINT_IGNORED",
    "HISTOGRAMS_JSONL",
    "HISTOGRAMS_PARQUET",
    "HISTOGRAM_SCHEMA",
    "INTERRUPTED",
    "LOCK_FILE",
    "META_FILE",
    "METRICS_JSONL",
    "METRICS_PARQUET",
    "PENDING",
    "RESERVE_BYTES",
    "RESERVE_FILE",
    "RUNNING",
    "SHORT_TRACEBACK_CHARS",
    "STATES",
    "STATUS_FILE",
    "SWEEP_FILE",
    "ConfigMismatchError",
    "RunLock",
    "RunLockedError",
    "RunStore",
    "RunStoreError",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_resume",
    "config_differences",
    "config_fingerprint",
    "config_identity",
    "file_mode",
    "final_value",
    "flatten_config",
    "histogram_names",
    "histograms_table",
    "identity_differences",
    "is_run_store",
    "is_sweep_folder",
    "load_histograms",
    "load_metrics",
    "metrics_source",
    "metrics_table",
    "numeric_environment",
    "read_config",
    "read_curve",
    "read_jsonl",
    "read_meta",
    "read_metrics",
    "read_status",
    "read_sweep_record",
    "remove_stale_temporaries",
    "run_record_files",
    "JsonlTail",
    "read_json_object",
    "utc_now",
    "verify_run",
]
