"""The ``logger`` block, validated (:func:`parse_logger_config`), and :func:`build_loggers`: the run store and the
console always, and each optional logger with its ``logger.<name>`` block."""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Mapping
from typing import Any

from dataflex_rl.registry import plugin_modules
from dataflex_rl.tracking.base import LOGGERS, MultiLogger
from dataflex_rl.tracking.console import ConsoleLogger
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store import RunStore
from dataflex_rl.validation import ConfigError, check_int_at_least, check_keys, check_non_negative_int, to_plain

LOG = logging.getLogger(__name__)

COMMON_KEYS = ("hist_every", "console_every")
# The optional loggers a run has unless told otherwise (the logger group's defaults list is built from it).
DEFAULT_LOGGERS = ("wandb",)


def in_tree_loggers() -> list[str]:
    """The optional loggers of this package: one module ``dataflex_rl/tracking/<name>_logger.py`` each."""
    return sorted(plugin_modules(__package__, suffix="_logger"))


def logger_class(name: str) -> Any:
    """The class registered as ``name``, importing ``dataflex_rl.tracking.<name>_logger`` first if needed."""
    if name not in LOGGERS and name in in_tree_loggers():
        importlib.import_module(f"{__package__}.{name}_logger")
    return LOGGERS.get(name)


@dataclasses.dataclass(frozen=True)
class LoggerConfig:
    """``logger``: the common keys and, in ``loggers``, each optional logger's checked ``Config``."""

    hist_every: int = 10  # log token-weight / token-prob histograms every N steps (0: never)
    console_every: int = 10  # one console line every N steps (and at every evaluation step)
    loggers: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {name: logger_class(name).Config() for name in DEFAULT_LOGGERS})

    def __post_init__(self) -> None:
        check_non_negative_int("logger.hist_every", self.hist_every)
        check_int_at_least("logger.console_every", self.console_every, 1)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: an optional logger's settings by name.
        loggers = self.__dict__.get("loggers")
        if loggers is not None and name in loggers:
            return loggers[name]
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (optional loggers: {list(loggers or ())})"
        )


def parse_logger_config(cfg: Mapping[str, Any] | LoggerConfig | None) -> LoggerConfig:
    """Validate the ``logger`` block (None: the defaults); each other key names an optional logger to run, checked by
    its registered class's ``Config`` (a null block: its defaults)."""
    if isinstance(cfg, LoggerConfig):
        return cfg
    if cfg is None:
        return LoggerConfig()
    plain = to_plain(cfg)
    allowed = (*COMMON_KEYS, *sorted({*LOGGERS.names(), *in_tree_loggers()}))
    if not isinstance(plain, Mapping):
        raise ConfigError(f"logger = {plain!r} is not allowed: it must be a mapping with keys {', '.join(allowed)}")
    names = [key for key in plain if key not in COMMON_KEYS]
    try:  # each other key names an optional logger (registered, or an in-tree module that registers it)
        for name in names:
            logger_class(name)
    except KeyError:  # RegistryError
        check_keys("logger", plain, allowed)
    loggers = {}
    for name in names:
        config_cls, block = logger_class(name).Config, {} if plain[name] is None else plain[name]
        fields = [field.name for field in dataclasses.fields(config_cls)]
        if not isinstance(block, Mapping):
            raise ConfigError(f"logger.{name} = {block!r} is not allowed: it must be a mapping with keys "
                              f"{', '.join(fields)}")
        check_keys(f"logger.{name}", block, fields)
        loggers[name] = config_cls(**block)
    return LoggerConfig(**{key: plain[key] for key in COMMON_KEYS if key in plain}, loggers=loggers)


def build_loggers(logger_cfg: Mapping[str, Any] | LoggerConfig | None, run_store: RunStore, identity: RunIdentity,
                  resolved_config: Mapping[str, Any]) -> MultiLogger:
    """The run store (its errors stop the run), each optional logger in order (None: off), the console."""
    config = parse_logger_config(logger_cfg)
    loggers: list[Any] = [run_store]
    for name, settings in config.loggers.items():
        try:
            logger = logger_class(name).from_config(
                settings, run_dir=run_store.run_dir, identity=identity, resolved_config=resolved_config
            )
        except Exception as error:  # a logger that cannot start must leave the run going, as one that fails later
            LOG.warning("logger %s cannot start (%s: %s); the run store still has everything",
                        name, type(error).__name__, error)
            continue
        if logger is not None:
            loggers.append(logger)
    loggers.append(ConsoleLogger(every=config.console_every))
    return MultiLogger(loggers, critical=[run_store], hist_every=config.hist_every)
