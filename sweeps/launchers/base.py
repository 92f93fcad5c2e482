"""The launcher interface and its registry: each run in its own OS process, so a crash or SIGKILL of one run never
stops the others.

A launcher starts runs, reports how each ended and stops them; the driver polls :meth:`Launcher.poll` and stops
runs with :meth:`Launcher.terminate` (SIGTERM, scancel, stop_job) then :meth:`Launcher.kill` after the grace period.
Exit codes follow ``subprocess``: negative = killed by that signal.

Every launcher is a :class:`Launcher` subclass registered in :data:`LAUNCHERS` under its ``launcher=`` name, in a
module of this package (every module here is imported when the package is), with its Hydra config
``conf/sweeps/launcher/<name>.yaml``. Its settings, if any, are the ``<name>:`` block of that YAML, typed by the
class's :attr:`Launcher.settings` dataclass (``slurm.partition=...``). This module imports nothing else of the
sweep package, so ``sweeps.config`` can check ``launcher=`` names against the registry.
"""

from __future__ import annotations

import re

import abc
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from dataflex_rl.registry import Registry
from dataflex_rl.validation import ConfigError

LAUNCHERS: Registry[type[Launcher]] = Registry("launcher")


class RunToLaunch(Protocol):
    """What a launcher needs of a planned run (:class:`sweeps.commands.PlannedRun` is one)."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    run_dir: Path
    log_path: Path


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a run's process ended: its exit code (None when unknown), if any, what went wrong around it, and whether
    the scheduler stopped it (scancel, time limit, preemption: the run is interrupted, not failed)."""

    exit_code: int | None
    error: str | None = None
    interrupted: bool = False


@dataclasses.dataclass
class Job:
    """A launched run: the plan and the launcher's handle (process, submitit job or Ray job id)."""

    run: RunToLaunch
    handle: Any
    info: dict[str, Any]
    started: float = dataclasses.field(default_factory=time.monotonic)
    waiting: str | None = None  # why it has not started yet, as last reported (:meth:`Launcher.waiting`)


def process_matches(pid: int, marker: str) -> bool:
    """True when process ``pid`` is alive and its command line holds ``marker`` (a run folder)."""
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in command_line


def write_log_header(log_path: Path, attempt: int, line: str) -> None:
    """Append ``=== attempt N at <time>: <command line>`` to a run's log before each launch."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== attempt {attempt} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {line}\n")


class Launcher(abc.ABC):
    """Starts runs, reports their end, stops them (see the module doc).

    Class attributes a subclass may set: ``name`` (its ``launcher=`` value), ``settings`` (the frozen dataclass
    of its ``<name>:`` config block, or None), ``batch`` (every pending run is submitted at once and the scheduler
    limits concurrency), ``runs_here`` (runs share this machine's cores: ``jobs`` defaults to the core count and
    the warm start gets a lone run's threads).
    """

    name: ClassVar[str] = ""
    settings: ClassVar[type | None] = None
    batch: ClassVar[bool] = False
    runs_here: ClassVar[bool] = False
    threads_origin: ClassVar[str] = ""  # the setting :meth:`threads_per_run` reads, for the summary line

    @classmethod
    def from_config(cls, settings: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        """The launcher for one sweep: ``settings`` is an instance of :attr:`settings` (None when it has none),
        ``parallelism`` the most runs live at once."""
        return cls()

    @classmethod
    def threads_per_run(cls, settings: Any) -> int | None:
        """Threads each run gets from this launcher's settings (None: the driver's default rule)."""
        return None

    @abc.abstractmethod
    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        """Start ``runs``; one :class:`Job` per run, in order."""

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
        """Stop the run now (after the grace period)."""
        self.terminate(job)

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        """Whether a run launched by an earlier invocation (``info`` from sweep.json) is still going."""
        return False

    def close(self) -> None:
        """Release connections."""


def launcher_class(name: Any) -> type[Launcher]:
    """The class registered as ``name``; :class:`ConfigError` naming the registered ones."""
    if not isinstance(name, str) or name not in LAUNCHERS:
        raise ConfigError(f"launcher = {name!r} is not allowed: registered launchers: {', '.join(LAUNCHERS.names())}")
    return LAUNCHERS.get(name)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_launcher_string(key: str, value: Any, pattern: str | None = None, allowed: str = "") -> str:
    """A launcher setting that ends up in a job script or a job request: a string without control characters (a
    newline would split an sbatch script into lines of its own), matching ``pattern`` when given (``allowed`` says
    what it accepts); :class:`ConfigError` naming key, value and what is allowed."""
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r} is not allowed: it must be a string")
    if _CONTROL.search(value):
        raise ConfigError(f"{key} = {value!r} is not allowed: it holds a control character (newline, tab, ...); "
                          f"give it on one line")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise ConfigError(f"{key} = {value!r} is not allowed: {allowed}")
    return value


def parse_settings(name: str, given: Any) -> Any:
    """The typed settings of launcher ``name`` from its ``<name>:`` block (a mapping or None; unknown keys refused).

    A launcher without settings returns None and refuses a non-empty block."""
    cls = launcher_class(name).settings
    given = {} if given is None else given
    if not isinstance(given, Mapping):
        raise ConfigError(f"{name} = {given!r} is not allowed: it must be a mapping of launcher={name} settings")
    if cls is None:
        if given:
            raise ConfigError(f"{name}.{next(iter(given))} is not allowed: launcher={name} has no settings")
        return None
    allowed = [field.name for field in dataclasses.fields(cls)]
    unknown = [key for key in given if key not in allowed]
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]} is not allowed: unknown key; allowed keys: {', '.join(allowed)}")
    return cls(**given)


def build_launcher(config: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
    """The launcher registered under ``config.launcher`` (``config``: a :class:`sweeps.config.SweepConfig`), built
    from ``config.launcher_settings``."""
    return launcher_class(config.launcher).from_config(config.launcher_settings, sweep_dir, sweep, parallelism)
