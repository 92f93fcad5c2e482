"""Tracking: the logger protocol, the run store (source of truth), a console line and the optional loggers (W&B),
which come from the :data:`LOGGERS` registry, one ``conf/logger/<name>/`` YAML each (see :mod:`.build`).

Typical use in a trainer::

    identity = RunIdentity.for_config(resolved, sweep=..., run=..., backend=..., mechanism=..., alpha=..., seed=...)
    store = RunStore(run_dir)
    store.write_meta(identity)
    store.set_status("running", step=start_step)
    if start_step > 0:
        store.truncate_after(start_step)
    with build_loggers(resolved["logger"], store, identity, resolved) as loggers:
        loggers.log_config(resolved)
        for step in ...:
            loggers.log_metrics(step, metrics)
            if loggers.wants_histogram(step):
                loggers.log_histogram(step, keys.HIST_WEIGHT, edges, counts)
    # leaving the block closes every logger: completed, or failed/interrupted with the traceback in status.json
"""

from dataflex_rl.tracking.base import CLOSE_STATES, LOGGERS, Logger, MultiLogger, register_logger
from dataflex_rl.tracking.build import LoggerConfig, build_loggers, parse_logger_config
from dataflex_rl.tracking.console import ConsoleLogger
from dataflex_rl.tracking.identity import RunIdentity, config_hash, git_commit
from dataflex_rl.tracking.run_store import (
    STATES,
    ConfigMismatchError,
    RunLock,
    RunLockedError,
    RunStore,
    RunStoreError,
    check_resume,
    config_fingerprint,
    final_value,
    load_histograms,
    load_metrics,
    read_config,
    read_curve,
    read_jsonl,
    read_meta,
    read_metrics,
    read_status,
)
from dataflex_rl.tracking.wandb_logger import WANDB_MODES, WandbConfig, WandbLogger, wandb_run_id

__all__ = [
    "CLOSE_STATES",
    "LOGGERS",
    "STATES",
    "WANDB_MODES",
    "ConfigMismatchError",
    "ConsoleLogger",
    "Logger",
    "LoggerConfig",
    "MultiLogger",
    "RunIdentity",
    "RunLock",
    "RunLockedError",
    "RunStore",
    "RunStoreError",
    "WandbConfig",
    "WandbLogger",
    "build_loggers",
    "check_resume",
    "config_fingerprint",
    "config_hash",
    "final_value",
    "git_commit",
    "load_histograms",
    "load_metrics",
    "parse_logger_config",
    "read_config",
    "read_curve",
    "read_jsonl",
    "read_meta",
    "read_metrics",
    "read_status",
    "register_logger",
    "wandb_run_id",
]
