"""The launcher interface and registry: each run in its own OS process (a crash of one never stops the others).
The driver polls :meth:`Launcher.poll`, stops runs with :meth:`Launcher.terminate`, then :meth:`Launcher.kill` after
the grace period; exit codes follow ``subprocess`` (negative: killed by that signal)."""

from __future__ import annotations

import abc
import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dataflex_rl.registry import Registry
from dataflex_rl.validation import ConfigError, build_params, defaults_of

LAUNCHERS: Registry[type[Launcher]] = Registry("launcher")


class RunToLaunch(Protocol):
    """What a launcher needs of a planned run (:class:`sweeps.plan.PlannedRun` is one)."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    run_dir: Path
    log_path: Path


@dataclasses.dataclass(frozen=True)
class Outcome:
    """``interrupted``: the scheduler stopped the run (scancel, time limit, preemption), not a failure."""

    exit_code: int | None
    error: str | None = None
    interrupted: bool = False


@dataclasses.dataclass
class Job:
    run: RunToLaunch
    handle: Any
    info: dict[str, Any]
    started: float = dataclasses.field(default_factory=time.monotonic)
    waiting: str | None = None  # why it has not started yet, as last reported (:meth:`Launcher.waiting`)


def process_matches(pid: int, marker: str) -> bool:
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in command_line


def write_log_header(log_path: Path, attempt: int, line: str) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== attempt {attempt} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {line}\n")


class Launcher(abc.ABC):
    """``batch``: the scheduler limits concurrency; ``runs_here``: runs share this machine's cores."""

    name: ClassVar[str] = ""
    settings: ClassVar[type | None] = None
    batch: ClassVar[bool] = False
    runs_here: ClassVar[bool] = False
    threads_origin: ClassVar[str] = ""  # the setting :meth:`threads_per_run` reads, for the summary line

    @classmethod
    def from_config(cls, settings: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        return cls()

    @classmethod
    def threads_per_run(cls, settings: Any) -> int | None:
        """Threads each run gets from this launcher's settings (None: the driver's default rule)."""
        return None

    @abc.abstractmethod
    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        """One Job per run, in order."""

    @abc.abstractmethod
    def poll(self, job: Job) -> Outcome | None:
        """The outcome once the run has ended, else None."""

    @abc.abstractmethod
    def terminate(self, job: Job) -> None:
        """Ask the run to stop (it marks itself interrupted and keeps its checkpoint)."""

    def waiting(self, job: Job) -> str | None:
        """Why a launched run has not started yet (a scheduler's queue reason), None once it runs."""
        return None

    def kill(self, job: Job) -> None:
        self.terminate(job)

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        """Whether a run launched by an earlier invocation (``info`` from sweep.json) is still going."""
        return False

    def close(self) -> None:
        """Release connections."""


def launcher_class(name: Any) -> type[Launcher]:
    if not isinstance(name, str) or name not in LAUNCHERS:
        raise ConfigError(f"launcher = {name!r} is not allowed: registered launchers: {', '.join(LAUNCHERS.names())}")
    return LAUNCHERS.get(name)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_launcher_string(key: str, value: Any, pattern: str | None = None, allowed: str = "") -> str:
    """A string for a job script: no control characters, matching ``pattern`` when given."""
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a string")
    if _CONTROL.search(value):
        raise ConfigError(f"{key} = {value!r} is not allowed: it holds a control character (newline, tab, ...); "
                          f"give it on one line")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise ConfigError(f"{key} = {value!r} is not allowed: {allowed}")
    return value


def parse_settings(name: str, given: Any) -> Any:
    """The typed settings of launcher ``name`` (None for a launcher without settings)."""
    cls = launcher_class(name).settings
    given = {} if given is None else given
    if cls is None:
        if given:
            raise ConfigError(f"{name} = {given!r} is not allowed: launcher={name} has no settings")
        return None
    return build_params(name, cls, given)


def store_settings_schemas() -> None:
    """Store each launcher's settings defaults as the ConfigStore node ``launcher_settings/<name>``."""
    from hydra.core.config_store import ConfigStore

    for name in LAUNCHERS.names():
        settings = LAUNCHERS.get(name).settings
        if settings is not None:
            ConfigStore.instance().store(group="launcher_settings", name=name, node=defaults_of(settings))


def build_launcher(config: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
    return launcher_class(config.launcher).from_config(config.launcher_settings, sweep_dir, sweep, parallelism)
