"""The ``logger`` config group, validated (:func:`parse_logger_config`), and :func:`build_loggers`.

The group (``conf/logger/default.yaml``) holds the keys every run has, ``hist_every`` and ``console_every``, and one
block per optional logger, each composed from its own YAML, ``conf/logger/<name>/default.yaml``, at
``logger.<name>``. A block's name is a :data:`~dataflex_rl.tracking.base.LOGGERS` registry name; the class
registered under it checks the block (its ``Config``) and builds the logger (``from_config``). Nothing here names
a particular optional logger: a new one is a module ``dataflex_rl/tracking/<name>_logger.py`` that registers its
class (imported on first use of the name) plus its YAML, switched on with ``+logger/<name>=default`` or by adding
it to the defaults list of ``conf/logger/default.yaml``. The run store and the console line are always on.
"""

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
from dataflex_rl.validation import ConfigError, check_keys, check_non_negative_int, to_plain

LOG = logging.getLogger(__name__)

COMMON_KEYS = ("hist_every", "console_every")
# The optional loggers of LoggerConfig() and parse_logger_config(None): the defaults list of
# conf/logger/default.yaml, as the Python API's default (a test checks that the two agree).
DEFAULT_LOGGERS = ("wandb",)
# In-tree optional loggers live in modules named after their registry name: dataflex_rl/tracking/<name>_logger.py.
MODULE_SUFFIX = "_logger"


def logger_class(name: str) -> Any:
    """The class registered as ``name`` in :data:`LOGGERS`, importing ``dataflex_rl.tracking.<name>_logger`` first
    when the name is not registered yet (the module registers its class on import)."""
    if name not in LOGGERS and isinstance(name, str):
        module = plugin_modules(__package__, suffix=MODULE_SUFFIX).get(name)
        if module is not None:
            importlib.import_module(module)
    return LOGGERS.get(name)


def available_loggers() -> list[str]:
    """Registered logger names plus in-tree ``*_logger`` modules not imported yet (for error messages)."""
    return sorted({*LOGGERS.names(), *plugin_modules(__package__, suffix=MODULE_SUFFIX)})


def is_logger_name(name: Any) -> bool:
    """Whether ``name`` names an optional logger (registered, or an in-tree module that registers it)."""
    if not isinstance(name, str):
        return False
    try:
        logger_class(name)
    except KeyError:  # RegistryError
        return False
    return True


@dataclasses.dataclass(frozen=True, init=False)
class LoggerConfig:
    """The ``logger`` config group: the common keys and, per optional logger, its checked ``Config``.

    ``loggers`` maps a registry name to its settings, in the order the loggers are built; ``config.wandb`` reads
    one by name. ``LoggerConfig()`` is the project's default (``hist_every=10``, ``console_every=10``, W&B
    offline), as ``conf/logger/default.yaml`` composes it. Optional loggers may also be given by keyword:
    ``LoggerConfig(wandb=WandbConfig(mode="disabled"))``; ``loggers={}`` means none.
    """

    hist_every: int
    console_every: int
    loggers: Mapping[str, Any]

    def __init__(
        self, hist_every: int = 10, console_every: int = 10, loggers: Mapping[str, Any] | None = None, **named: Any
    ) -> None:
        if loggers is None:
            loggers = {} if named else {name: logger_class(name).Config() for name in DEFAULT_LOGGERS}
        object.__setattr__(self, "hist_every", hist_every)
        object.__setattr__(self, "console_every", console_every)
        object.__setattr__(self, "loggers", {**loggers, **named})
        self.__post_init__()

    def __post_init__(self) -> None:
        check_non_negative_int("logger.hist_every", self.hist_every)
        check_non_negative_int("logger.console_every", self.console_every)
        if self.console_every < 1:
            raise ConfigError(
                f"logger.console_every = {self.console_every!r} is not allowed: it must be an integer >= 1"
            )

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields: an optional logger's settings by name.
        loggers = self.__dict__.get("loggers")
        if loggers is not None and name in loggers:
            return loggers[name]
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (optional loggers: {list(loggers or ())})"
        )


def parse_logger_block(name: str, block: Any) -> Any:
    """``logger.<name>`` checked by the registered class's ``Config`` (null: its defaults)."""
    config_cls = logger_class(name).Config
    allowed = [field.name for field in dataclasses.fields(config_cls)]
    block = {} if block is None else block
    if not isinstance(block, Mapping):
        raise ConfigError(
            f"logger.{name} = {block!r} is not allowed: it must be a mapping with keys {', '.join(allowed)}"
        )
    check_keys(f"logger.{name}", block, allowed)
    return config_cls(**block)


def parse_logger_config(cfg: Mapping[str, Any] | LoggerConfig | None) -> LoggerConfig:
    """Validate the ``logger`` group (dict, ``DictConfig``, LoggerConfig or None for the defaults).

    Every key besides ``hist_every`` and ``console_every`` names an optional logger, which runs with the settings
    of its block; a logger without a block does not run. Unknown keys and bad values raise
    :class:`~dataflex_rl.validation.ConfigError` (a ``ValueError``) naming the key, the value and what is allowed.
    """
    if isinstance(cfg, LoggerConfig):
        return cfg
    if cfg is None:
        return LoggerConfig()
    plain = to_plain(cfg)
    if not isinstance(plain, Mapping):
        raise ConfigError(
            f"logger = {plain!r} is not allowed: it must be a mapping with keys "
            f"{', '.join((*COMMON_KEYS, *available_loggers()))}"
        )
    names = [key for key in plain if key not in COMMON_KEYS]
    if not all(is_logger_name(name) for name in names):
        check_keys("logger", plain, (*COMMON_KEYS, *available_loggers()))
    return LoggerConfig(
        **{key: plain[key] for key in COMMON_KEYS if key in plain},
        loggers={name: parse_logger_block(name, plain[name]) for name in names},
    )


def start_optional_logger(name: str, settings: Any, run_store: RunStore, identity: RunIdentity,
                          resolved_config: Mapping[str, Any]) -> Any:
    """The logger ``name`` built from its settings, or None when its settings turn it off or it cannot start (a
    warning says why: an optional logger never stops a run)."""
    try:
        return logger_class(name).from_config(
            settings, run_dir=run_store.run_dir, identity=identity, resolved_config=resolved_config
        )
    except Exception as error:  # a logger that cannot start must leave the run going, as one that fails later
        LOG.warning("logger %s cannot start (%s: %s); the run store still has everything",
                    name, type(error).__name__, error)
        return None


def build_loggers(
    logger_cfg: Mapping[str, Any] | LoggerConfig | None,
    run_store: RunStore,
    identity: RunIdentity,
    resolved_config: Mapping[str, Any],
) -> MultiLogger:
    """The run's loggers: run store (critical: its errors stop the run), each optional logger of the config in
    order (W&B unless disabled), console.

    W&B starts here (``wandb.init`` offline: 0.1 to 0.4 s, plus about 1 s to import wandb the first time).
    The caller still calls ``log_config`` to write ``config.yaml``.
    """
    config = parse_logger_config(logger_cfg)
    loggers: list[Any] = [run_store]
    for name, settings in config.loggers.items():
        logger = start_optional_logger(name, settings, run_store, identity, resolved_config)
        if logger is not None:
            loggers.append(logger)
    loggers.append(ConsoleLogger(every=config.console_every))
    return MultiLogger(loggers, critical=[run_store], hist_every=config.hist_every)
