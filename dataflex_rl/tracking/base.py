"""The logger protocol, the :data:`LOGGERS` registry of optional loggers, and :class:`MultiLogger`, which fans each
call out and closes them with the run's final state (docs/sweeps.md, "Loggers")."""

from __future__ import annotations

import errno
import logging
import traceback as traceback_module
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from dataflex_rl.registry import Registry
from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, check_state

LOG = logging.getLogger(__name__)


@runtime_checkable
class Logger(Protocol):
    """What a trainer may call on any logger."""

    def log_config(self, config: dict) -> None:
        """Record the fully resolved config (nested dict)."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the scalar metrics of one step, every key of that step at once."""

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Record one histogram: ``len(edges) == len(counts) + 1``; bin i is ``[edges[i], edges[i + 1])``."""

    def close(self, state: str = COMPLETED) -> None:
        """Finish the run in ``state`` (one of ``run_store.CLOSE_STATES``)."""


# name -> class of an optional logger, with a frozen dataclass ``Config`` and ``from_config`` (docs/sweeps.md).
LOGGERS: Registry[Any] = Registry("logger")

# Errors of the machine, named first even when a library wraps them (torch: a full disk -> "unexpected pos ...").
_MACHINE_ERRNOS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def describe_error(error: BaseException) -> str:
    """``"<Type>: <message>"`` of a run's failure, led by a full disk or exceeded quota found in its chain."""
    text = f"{type(error).__name__}: {error}"
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _MACHINE_ERRNOS:
            where = f" ({current.filename})" if current.filename else ""
            return text if current is error else f"{_MACHINE_ERRNOS[current.errno]}{where}; while: {text}"
        current = current.__cause__ or current.__context__
    return text


def _name(logger: object) -> str:
    return str(getattr(logger, "name", None) or type(logger).__name__)


class MultiLogger:
    """Fans every call out to ``loggers`` in order; an optional logger that fails is disabled and the others go on,
    a ``critical`` one's error stops the run."""

    def __init__(self, loggers: Iterable[Logger], *, critical: Iterable[Logger] = (), hist_every: int = 1) -> None:
        self.loggers: list[Logger] = list(loggers)
        self._critical_ids = {id(logger) for logger in critical}
        unknown = [_name(logger) for logger in critical if all(logger is not known for known in self.loggers)]
        if unknown:
            raise ValueError(f"critical loggers must be among the loggers; not found: {unknown}")
        if isinstance(hist_every, bool) or not isinstance(hist_every, int) or hist_every < 0:
            raise ValueError(f"hist_every = {hist_every!r} is not allowed: it must be an integer >= 0 (0 = never)")
        self.hist_every = hist_every
        self._disabled: set[int] = set()
        self._closed = False

    def log_config(self, config: dict) -> None:
        self._call("log_config", config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call("log_metrics", step, metrics)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        if self.wants_histogram(step):
            self._call("log_histogram", step, name, edges, counts)

    def close(self, state: str = COMPLETED) -> None:
        check_state(state, close=True)
        if not self._closed:
            self._closed = True
            self._call("close", state)

    def wants_histogram(self, step: int) -> bool:
        """Whether :meth:`log_histogram` at ``step`` is forwarded, so a trainer can skip computing it."""
        return self.hist_every > 0 and step % self.hist_every == 0

    @property
    def active(self) -> list[Logger]:
        return [logger for logger in self.loggers if id(logger) not in self._disabled]

    def _call(self, method: str, *args: Any, only: Iterable[Logger] | None = None) -> None:
        for logger in self.active if only is None else only:
            try:
                getattr(logger, method)(*args)
            except Exception as error:  # any failure of an optional logger must not stop training
                if id(logger) in self._critical_ids:
                    raise
                self._disabled.add(id(logger))
                LOG.warning("logger %s failed in %s (%s: %s); it is disabled for the rest of the run, the others "
                            "go on", _name(logger), method, type(error).__name__, error)

    def __enter__(self) -> MultiLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close(COMPLETED)
            return
        state = INTERRUPTED if isinstance(exc, KeyboardInterrupt) else FAILED
        formatted = "".join(traceback_module.format_exception(exc_type, exc, tb))
        recording = [logger for logger in self.active if callable(getattr(logger, "record_error", None))]
        self._call("record_error", state, describe_error(exc), formatted, only=recording)
        self.close(state)
