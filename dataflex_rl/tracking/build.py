"""The ``logger`` config group (``conf/logger/default.yaml``), validated, and :func:`build_loggers`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dataflex_rl.validation import ConfigError, check_choice, check_keys, check_non_negative_int, to_plain
from dataflex_rl.tracking.base import MultiLogger
from dataflex_rl.tracking.console import ConsoleLogger
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store import RunStore
from dataflex_rl.tracking.wandb_logger import TAG_MAX_LENGTH, WANDB_MODES, WandbLogger

LOGGER_KEYS = ("hist_every", "console_every", "wandb")
WANDB_KEYS = ("mode", "project", "entity", "tags")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """``logger.wandb``: see :mod:`dataflex_rl.tracking.wandb_logger`."""

    mode: str = "offline"
    project: str = "dataflex-rl"
    entity: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice("logger.wandb.mode", self.mode, WANDB_MODES)
        if not isinstance(self.project, str) or not self.project:
            raise ConfigError(f"logger.wandb.project = {self.project!r} is not allowed: it must be a non-empty string")
        if self.entity is not None and (not isinstance(self.entity, str) or not self.entity):
            raise ConfigError(
                f"logger.wandb.entity = {self.entity!r} is not allowed: it must be a non-empty string or null"
            )
        if isinstance(self.tags, str) or not isinstance(self.tags, (list, tuple)):
            raise ConfigError(f"logger.wandb.tags = {self.tags!r} is not allowed: it must be a list of strings")
        for tag in self.tags:
            if not isinstance(tag, str) or not 0 < len(tag) <= TAG_MAX_LENGTH:
                raise ConfigError(
                    f"logger.wandb.tags entry {tag!r} is not allowed: "
                    f"tags are strings of 1 to {TAG_MAX_LENGTH} characters"
                )
        object.__setattr__(self, "tags", tuple(self.tags))


@dataclasses.dataclass(frozen=True)
class LoggerConfig:
    """The ``logger`` config group."""

    hist_every: int = 10
    console_every: int = 10
    wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        check_non_negative_int("logger.hist_every", self.hist_every)
        check_non_negative_int("logger.console_every", self.console_every)
        if self.console_every < 1:
            raise ConfigError(
                f"logger.console_every = {self.console_every!r} is not allowed: it must be an integer >= 1"
            )


def parse_logger_config(cfg: Mapping[str, Any] | LoggerConfig | None) -> LoggerConfig:
    """Validate the ``logger`` group (dict, ``DictConfig``, LoggerConfig or None for the defaults).

    Unknown keys and bad values raise :class:`~dataflex_rl.config.ConfigError` (a ``ValueError``) naming the key,
    the value and what is allowed.
    """
    if isinstance(cfg, LoggerConfig):
        return cfg
    plain = to_plain(cfg) if cfg is not None else {}
    if not isinstance(plain, Mapping):
        raise ConfigError(f"logger = {plain!r} is not allowed: it must be a mapping with keys {', '.join(LOGGER_KEYS)}")
    check_keys("logger", plain, LOGGER_KEYS)
    wandb_plain = plain.get("wandb") or {}
    if not isinstance(wandb_plain, Mapping):
        raise ConfigError(
            f"logger.wandb = {wandb_plain!r} is not allowed: it must be a mapping with keys {', '.join(WANDB_KEYS)}"
        )
    check_keys("logger.wandb", wandb_plain, WANDB_KEYS)
    return LoggerConfig(
        **{key: plain[key] for key in ("hist_every", "console_every") if key in plain},
        wandb=WandbConfig(**wandb_plain),
    )


def build_loggers(
    logger_cfg: Mapping[str, Any] | LoggerConfig | None,
    run_store: RunStore,
    identity: RunIdentity,
    resolved_config: Mapping[str, Any],
) -> MultiLogger:
    """The run's loggers: run store (critical: its errors stop the run), W&B (unless disabled), console.

    W&B starts here (``wandb.init`` offline: 0.1 to 0.4 s, plus about 1 s to import wandb the first time).
    The caller still calls ``log_config`` to write ``config.yaml``.
    """
    config = parse_logger_config(logger_cfg)
    loggers: list[Any] = [run_store]
    if config.wandb.mode != "disabled":
        loggers.append(
            WandbLogger(
                identity=identity,
                run_dir=run_store.run_dir,
                config=resolved_config,
                mode=config.wandb.mode,
                project=config.wandb.project,
                entity=config.wandb.entity,
                tags=config.wandb.tags,
            )
        )
    loggers.append(ConsoleLogger(every=config.console_every))
    return MultiLogger(loggers, critical=[run_store], hist_every=config.hist_every)
