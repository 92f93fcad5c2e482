"""The W&B logger, set by the ``logger.wandb`` block (checked by :class:`WandbConfig`). It never stops a run: if W&B
cannot start, one warning says so and it does nothing (docs/sweeps.md, "W&B")."""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.hashing import stable_hash
from dataflex_rl.tracking.base import LOGGERS
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store import COMPLETED, check_state
from dataflex_rl.validation import ConfigError, check_choice, to_plain

LOG = logging.getLogger(__name__)

WANDB_MODES = ("offline", "online", "disabled")
TAG_MAX_LENGTH = 64  # W&B refuses longer tags


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """``logger.wandb``: the keys of ``conf/logger/wandb/default.yaml``, checked."""

    mode: str = "offline"
    project: str = "dataflex-rl"
    entity: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice("logger.wandb.mode", self.mode, WANDB_MODES)
        for key, nullable in (("project", False), ("entity", True)):
            value = getattr(self, key)
            if not (isinstance(value, str) and value or nullable and value is None):
                raise ConfigError(f"logger.wandb.{key} = {value!r} is not allowed: it must be a non-empty string"
                                  + (" or null" if nullable else ""))
        if isinstance(self.tags, str) or not isinstance(self.tags, (list, tuple)):
            raise ConfigError(f"logger.wandb.tags = {self.tags!r} is not allowed: it must be a list of strings")
        for tag in self.tags:
            if not isinstance(tag, str) or not 0 < len(tag) <= TAG_MAX_LENGTH:
                raise ConfigError(f"logger.wandb.tags entry {tag!r} is not allowed: "
                                  f"tags are strings of 1 to {TAG_MAX_LENGTH} characters")
        object.__setattr__(self, "tags", tuple(self.tags))


def wandb_run_id(identity: RunIdentity) -> str:
    """The W&B run id from (sweep, run), so a resumed run continues its W&B run."""
    return stable_hash(f"{identity.sweep}\0{identity.run}", 16)


def _missing_credentials() -> str | None:
    try:
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:
        return None
    try:
        host = wandb_setup.singleton().settings.base_url
        auth = wbauth.authenticate_session(host=host, source="dataflex_rl", prompt=False, update_session=False)
    except (AttributeError, TypeError):  # W&B changed its internals: let wandb.init report any problem
        return None
    except Exception as error:  # W&B's AuthenticationError and friends
        return f"W&B credentials are invalid ({error})"
    if auth is None:
        return f"online mode needs credentials for {host} (set WANDB_API_KEY or run `wandb login`)"
    return None


@LOGGERS.register("wandb")
class WandbLogger:
    """A W&B run following the logger protocol (``run``: the live ``wandb.Run``, None when inactive)."""

    Config = WandbConfig

    @classmethod
    def from_config(cls, config: WandbConfig, *, run_dir: str | pathlib.Path, identity: RunIdentity,
                    resolved_config: Mapping[str, Any]) -> WandbLogger | None:
        """The run's W&B logger; None when ``mode`` is ``disabled`` (wandb is not imported)."""
        if config.mode == "disabled":
            return None
        return cls(identity=identity, run_dir=run_dir, config=resolved_config, settings=config)

    def __init__(self, *, identity: RunIdentity, run_dir: str | pathlib.Path, config: Mapping[str, Any],
                 settings: WandbConfig = WandbConfig()) -> None:
        self.settings, self.identity = settings, identity
        self.run: Any = None
        self.unavailable_reason: str | None = None
        if settings.mode != "disabled":
            self.run = self._start(pathlib.Path(run_dir), to_plain(config))

    def _start(self, run_dir: pathlib.Path, config: dict[str, Any]) -> Any:
        mode = self.settings.mode
        if mode == "offline":
            # Offline means no network: W&B otherwise posts error reports at exit (up to 10 s when blocked).
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            import wandb
        except ImportError as error:
            return self._unavailable(f"wandb cannot be imported ({error})")
        if mode == "online" and (missing := _missing_credentials()) is not None:
            return self._unavailable(missing)
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            # The configured mode wins over WANDB_MODE; console capture off (the trainer writes train.log).
            settings = wandb.Settings(mode=mode, console="off", quiet=True, save_code=False)
            return wandb.init(project=self.settings.project, entity=self.settings.entity, group=self.identity.sweep,
                              name=self.identity.wandb_name, job_type=self.identity.job_type,
                              id=wandb_run_id(self.identity), resume="allow", reinit="create_new",
                              tags=list(dict.fromkeys((*self.identity.tags, *self.settings.tags))),
                              config={**config, "run_identity": self.identity.to_dict()}, dir=str(run_dir),
                              settings=settings)
        except Exception as error:  # any W&B start-up failure must leave the run going
            return self._unavailable(f"wandb.init failed ({type(error).__name__}: {error})")

    def _unavailable(self, reason: str) -> None:
        self.unavailable_reason = reason
        LOG.warning("W&B unavailable: %s; the run store still has everything", reason)

    @property
    def active(self) -> bool:  # False when disabled, unavailable or closed
        return self.run is not None

    def log_config(self, config: dict) -> None:
        if self.run is not None:
            self.run.config.update(to_plain(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.run is not None:
            self.run.log(dict(metrics), step=step)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """One ``wandb.Histogram`` built from the given bins (no re-binning)."""
        if self.run is None:
            return
        import wandb

        histogram = wandb.Histogram(np_histogram=(counts, edges))  # arrays and tensors: W&B calls tolist()
        self.run.log({name: histogram}, step=step)

    def close(self, state: str = COMPLETED) -> None:
        """Finish the W&B run: exit code 0 when completed, 1 otherwise (W&B shows it as failed)."""
        check_state(state, close=True)
        run, self.run = self.run, None
        if run is not None:
            run.finish(exit_code=0 if state == COMPLETED else 1)
