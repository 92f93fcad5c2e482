"""The run store: one folder per run, the source of truth for local analysis. Import its names from here
(format, modules and reader API: docs/run_store.md)."""

from dataflex_rl.tracking.run_store.files import (CONFIG_FILE, HISTOGRAMS_JSONL, HISTOGRAMS_PARQUET, LOCK_FILE,
                                                 META_FILE, METRICS_JSONL, METRICS_PARQUET, RESERVE_FILE, STATUS_FILE,
                                                 SWEEP_FILE, RunStoreError, atomic_path, atomic_write_bytes,
                                                 atomic_write_json, file_mode, remove_stale_temporaries, utc_now)
from dataflex_rl.tracking.run_store.logs import HISTOGRAM_SCHEMA, JsonlTail, read_jsonl
from dataflex_rl.tracking.run_store.meta import numeric_environment
from dataflex_rl.tracking.run_store.reader import (final_value, is_run_store, is_sweep_folder, load_histograms,
                                                  metrics_source, read_config, read_curve, read_meta, read_metrics,
                                                  read_metrics_table, read_status, read_sweep_record, run_record_files)
from dataflex_rl.tracking.run_store.status import (CLOSE_STATES, COMPLETED, FAILED, INTERRUPTED, PENDING, RESERVE_BYTES,
                                                  RUNNING, STATES, check_state)
from dataflex_rl.tracking.run_store.verify import (FINGERPRINT_GROWING, FINGERPRINT_IGNORED, ConfigMismatchError,
                                                  check_resume, config_fingerprint, config_identity, flatten_config,
                                                  verify_run)
from dataflex_rl.tracking.run_store.writer import RunLock, RunLockedError, RunStore
