"""W&B logger: the same keys as the run store, in a W&B run named from the run's identity.

Settings: the ``logger.wandb`` block (``conf/logger/wandb/default.yaml``, checked by :class:`WandbConfig`).

- ``mode``: ``offline`` (default; files land in ``<run_dir>/wandb/``, upload later with ``wandb sync``), ``online``
  (needs credentials: ``WANDB_API_KEY``, ``wandb login`` or a netrc entry) or ``disabled`` (wandb is not even
  imported and nothing is written). The configured mode wins over a ``WANDB_MODE`` environment variable: set
  ``logger.wandb.mode`` instead.
- group = sweep, name = the run folder's name in a grid (built from its axes; else ``<sweep>-a<alpha>-s<seed>``),
  job_type = the non-seed factors, tags = mechanism, backend and the configured tags,
  config = the resolved config plus ``run_identity`` (the :class:`RunIdentity` fields, for analysis through the W&B
  API).
- The W&B run id is derived from (sweep, run), so a resumed run continues the same W&B run (``resume="allow"``).
  A sweep id must therefore be unique within a W&B project.
- W&B never stops a run: if it cannot start (no credentials in online mode, server unreachable, wandb-core
  failing) one warning says so and the logger does nothing; errors while logging are caught by
  :class:`~dataflex_rl.tracking.base.MultiLogger`.
- Quiet: console capture off (the trainer writes ``train.log``), W&B's info messages off (``quiet``), no code
  saving. System metrics stay on: W&B's own core process samples them, off the training thread.
- Offline means no network: W&B 0.31 otherwise sends its own usage telemetry and error reports to the W&B server
  even in offline mode (a DNS lookup and an HTTPS post at exit, up to 10 s where outbound traffic is dropped).
  So in offline mode this logger sets ``WANDB_ERROR_REPORTING=false`` in ``os.environ`` unless the variable is
  already set; it is the one environment variable set here, and it is inherited by child processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.tracking.base import check_close_state, register_logger
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.validation import ConfigError, check_choice, to_plain

LOG = logging.getLogger(__name__)

WANDB_MODES = ("offline", "online", "disabled")
TAG_MAX_LENGTH = 64  # W&B refuses longer tags
ERROR_REPORTING_VARIABLE = "WANDB_ERROR_REPORTING"
UNAVAILABLE_MESSAGE = "W&B unavailable: %s; the run store still has everything"


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """``logger.wandb``: the keys of ``conf/logger/wandb/default.yaml``, checked."""

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


def wandb_run_id(identity: RunIdentity) -> str:
    """Stable W&B run id: 16 hex digits of sha256 over ``<sweep>/<run>`` (same run -> same W&B run on resume)."""
    return hashlib.sha256(f"{identity.sweep}\0{identity.run}".encode()).hexdigest()[:16]


def wandb_tags(identity: RunIdentity, extra_tags: Sequence[str] = ()) -> list[str]:
    """Mechanism, backend, then the configured tags, without repeats."""
    tags: list[str] = []
    for tag in (*identity.tags, *extra_tags):
        if tag not in tags:
            tags.append(tag)
    return tags


def _missing_credentials() -> str | None:
    """Why online mode cannot log in, or None when credentials exist (or cannot be checked: init decides)."""
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


@register_logger("wandb")
class WandbLogger:
    """A W&B run following the logger protocol; a no-op when ``mode`` is ``disabled`` or W&B cannot start.

    ``run`` is the live ``wandb.Run`` (None when inactive).
    """

    name = "wandb"
    Config = WandbConfig

    @classmethod
    def from_config(
        cls,
        config: WandbConfig,
        *,
        run_dir: str | pathlib.Path,
        identity: RunIdentity,
        resolved_config: Mapping[str, Any],
    ) -> WandbLogger | None:
        """The run's W&B logger from ``logger.wandb``; None when ``mode`` is ``disabled`` (wandb is not imported)."""
        if config.mode == "disabled":
            return None
        return cls(
            identity=identity,
            run_dir=run_dir,
            config=resolved_config,
            mode=config.mode,
            project=config.project,
            entity=config.entity,
            tags=config.tags,
        )

    def __init__(
        self,
        *,
        identity: RunIdentity,
        run_dir: str | pathlib.Path,
        config: Mapping[str, Any],
        mode: str = "offline",
        project: str = "dataflex-rl",
        entity: str | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        if mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode = {mode!r} is not allowed; allowed values: {', '.join(WANDB_MODES)}")
        self.mode = mode
        self.identity = identity
        self.run: Any = None
        self.unavailable_reason: str | None = None
        if mode != "disabled":
            self.run = self._start(pathlib.Path(run_dir), to_plain(config), project, entity, list(tags))

    def _start(
        self, run_dir: pathlib.Path, config: dict[str, Any], project: str, entity: str | None, tags: list[str]
    ) -> Any:
        if self.mode == "offline":
            # W&B reads it when it starts its telemetry recorder and wandb-core (at the first init).
            os.environ.setdefault(ERROR_REPORTING_VARIABLE, "false")
        try:
            import wandb
        except ImportError as error:
            return self._unavailable(f"wandb cannot be imported ({error})")
        if self.mode == "online":
            missing = _missing_credentials()
            if missing is not None:
                return self._unavailable(missing)
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            settings = wandb.Settings(mode=self.mode, console="off", quiet=True, save_code=False)
            return wandb.init(
                project=project,
                entity=entity,
                group=self.identity.sweep,
                name=self.identity.wandb_name,
                job_type=self.identity.job_type,
                id=wandb_run_id(self.identity),
                resume="allow",
                reinit="create_new",
                tags=wandb_tags(self.identity, tags),
                config={**config, "run_identity": self.identity.to_dict()},
                dir=str(run_dir),
                settings=settings,
            )
        except Exception as error:  # any W&B start-up failure must leave the run going
            return self._unavailable(f"wandb.init failed ({type(error).__name__}: {error})")

    def _unavailable(self, reason: str) -> None:
        self.unavailable_reason = reason
        LOG.warning(UNAVAILABLE_MESSAGE, reason)
        return None

    @property
    def active(self) -> bool:
        """Whether a W&B run is live (False when disabled, unavailable or closed)."""
        return self.run is not None

    def log_config(self, config: dict) -> None:
        """Update the W&B run's config with the resolved config."""
        if self.run is not None:
            self.run.config.update(to_plain(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """``wandb.log`` of one step's scalars at ``step``."""
        if self.run is not None:
            self.run.log(dict(metrics), step=step)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """One ``wandb.Histogram`` built from the given bins (no re-binning)."""
        if self.run is None:
            return
        import wandb

        histogram = wandb.Histogram(np_histogram=(counts, edges))  # arrays and tensors: W&B calls tolist()
        self.run.log({name: histogram}, step=step)

    def close(self, state: str = "completed") -> None:
        """Finish the W&B run: exit code 0 when completed, 1 otherwise (W&B shows it as failed)."""
        check_close_state(state)
        run, self.run = self.run, None
        if run is not None:
            run.finish(exit_code=0 if state == "completed" else 1)
