"""Tracking: the logger protocol, the run store (:mod:`.run_store`), the run identity, the console line and the
optional loggers (docs/run_store.md)."""

from dataflex_rl.tracking.base import LOGGERS, Logger, MultiLogger
from dataflex_rl.tracking.build import LoggerConfig, build_loggers, parse_logger_config
from dataflex_rl.tracking.console import ConsoleLogger
from dataflex_rl.tracking.identity import RunIdentity, config_hash, git_commit
from dataflex_rl.tracking.run_store import RunStore
from dataflex_rl.tracking.wandb_logger import WandbConfig, WandbLogger, wandb_run_id
