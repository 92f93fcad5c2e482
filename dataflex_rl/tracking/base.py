"""The logger protocol every backend calls, and :class:`MultiLogger`, which fans one call out to several loggers.

A trainer holds one ``MultiLogger`` (from :func:`dataflex_rl.tracking.build_loggers`) and calls, in order::

    loggers.log_config(resolved_config)
    loggers.log_metrics(step, {key: float})          # once per step, every key of that step at once
    loggers.log_histogram(step, name, edges, counts)  # len(edges) == len(counts) + 1
    loggers.close("completed" | "failed" | "interrupted")

or uses it as a context manager, which closes with ``failed`` (or ``interrupted`` on ``KeyboardInterrupt``) and
records the traceback in the run store's ``status.json`` when the block raises.

:data:`LOGGERS` holds the optional loggers (W&B, ...), each built from its own block of the ``logger`` config
(``conf/logger/<name>/default.yaml``); see :func:`dataflex_rl.tracking.build.build_loggers` and
``docs/architecture.md`` ("Where to add: a logger").
"""

from __future__ import annotations

import errno
import logging
import traceback as traceback_module
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from dataflex_rl.registry import Registry

LOG = logging.getLogger(__name__)

CLOSE_STATES = ("completed", "failed", "interrupted")


@runtime_checkable
class Logger(Protocol):
    """What a trainer may call on any logger."""

    def log_config(self, config: dict) -> None:
        """Record the fully resolved config (nested dict)."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record the scalar metrics of one step."""

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Record one histogram: ``len(edges) == len(counts) + 1``; bin i is ``[edges[i], edges[i + 1])``."""

    def close(self, state: str = "completed") -> None:
        """Finish the run in ``state`` (one of :data:`CLOSE_STATES`)."""


# name -> class of an optional logger. A registered class has ``name``, a frozen dataclass ``Config`` (the keys of
# its YAML; ``__post_init__`` refuses bad values naming ``logger.<name>.<key>``) and a classmethod
# ``from_config(config, *, run_dir, identity, resolved_config)`` returning the logger, or None when the settings
# turn it off. Registry names equal the YAML folders under ``conf/logger/``.
LOGGERS: Registry[Any] = Registry("logger")
register_logger = LOGGERS.register


def check_close_state(state: str) -> str:
    """Refuse a close state outside :data:`CLOSE_STATES`."""
    if state not in CLOSE_STATES:
        raise ValueError(f"close state {state!r} is not allowed; allowed states: {', '.join(CLOSE_STATES)}")
    return state


def logger_name(logger: object) -> str:
    """The name used in warnings: the logger's ``name`` attribute, else its class name."""
    return str(getattr(logger, "name", None) or type(logger).__name__)


# Errors of the machine, not of the run: named first in a recorded error even when a library's own error wraps them
# (torch's checkpoint writer turns a full disk into "unexpected pos ...").
_MACHINE_ERRNOS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}


def describe_error(error: BaseException) -> str:
    """``"<Type>: <message>"`` of a run's failure, led by the cause a reader must see when an error in its chain
    (``__cause__``/``__context__``) is a full disk or an exceeded quota: ``"No space left on device (<file>); while:
    RuntimeError: unexpected pos ..."``."""
    text = f"{type(error).__name__}: {error}"
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _MACHINE_ERRNOS:
            reason = _MACHINE_ERRNOS[current.errno]
            where = f" ({current.filename})" if current.filename else ""
            return text if current is error else f"{reason}{where}; while: {text}"
        current = current.__cause__ or current.__context__
    return text


class MultiLogger:
    """Fans every call out to ``loggers`` in order.

    A logger that raises is reported once (a warning naming it and the error) and skipped from then on, so an
    unavailable W&B never stops training. Loggers listed in ``critical`` (normally the run store, the source of
    truth) are not shielded: their errors propagate, because a run that cannot record its results should stop.

    ``hist_every``: histograms are forwarded only at steps divisible by it (0 turns histograms off);
    :meth:`wants_histogram` lets the trainer skip computing them at other steps.
    """

    def __init__(self, loggers: Iterable[Logger], *, critical: Iterable[Logger] = (), hist_every: int = 1) -> None:
        self.loggers: list[Logger] = list(loggers)
        self._critical_ids = {id(logger) for logger in critical}
        unknown = [logger for logger in critical if all(logger is not known for known in self.loggers)]
        if unknown:
            raise ValueError(
                f"critical loggers must be among the loggers; not found: {[logger_name(x) for x in unknown]}"
            )
        if isinstance(hist_every, bool) or not isinstance(hist_every, int) or hist_every < 0:
            raise ValueError(f"hist_every = {hist_every!r} is not allowed: it must be an integer >= 0 (0 = never)")
        self.hist_every = hist_every
        self._disabled: set[int] = set()
        self._closed = False

    # --- protocol ------------------------------------------------------------------------------------------
    def log_config(self, config: dict) -> None:
        """Pass the resolved config to every enabled logger."""
        self._call("log_config", config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Pass one step's scalar metrics to every enabled logger."""
        self._call("log_metrics", step, metrics)

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Pass one histogram on when :meth:`wants_histogram` says so at ``step``."""
        if self.wants_histogram(step):
            self._call("log_histogram", step, name, edges, counts)

    def close(self, state: str = "completed") -> None:
        """Close every enabled logger once; later calls do nothing."""
        check_close_state(state)
        if self._closed:
            return
        self._closed = True
        self._call("close", state)

    # --- helpers -------------------------------------------------------------------------------------------
    def wants_histogram(self, step: int) -> bool:
        """Whether :meth:`log_histogram` at ``step`` is forwarded (``step % hist_every == 0``)."""
        return self.hist_every > 0 and step % self.hist_every == 0

    @property
    def active(self) -> list[Logger]:
        """The loggers not disabled by an error."""
        return [logger for logger in self.loggers if id(logger) not in self._disabled]

    def _call(self, method: str, *args: Any) -> None:
        for logger in self.active:
            self._call_one(logger, method, *args)

    def _call_one(self, logger: Logger, method: str, *args: Any) -> None:
        if id(logger) in self._critical_ids:
            getattr(logger, method)(*args)
            return
        try:
            getattr(logger, method)(*args)
        except Exception as error:  # any failure of an optional logger must not stop training
            self._disabled.add(id(logger))
            LOG.warning(
                "logger %s failed in %s (%s: %s); it is disabled for the rest of the run, the others go on",
                logger_name(logger),
                method,
                type(error).__name__,
                error,
            )

    # --- context manager -----------------------------------------------------------------------------------
    def __enter__(self) -> MultiLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close("completed")
            return
        state = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        error = describe_error(exc)
        formatted = "".join(traceback_module.format_exception(exc_type, exc, tb))
        # A logger that keeps errors (the run store: status.json) defines ``record_error``; the others only close.
        for logger in self.active:
            if callable(getattr(logger, "record_error", None)):
                self._call_one(logger, "record_error", state, error, formatted)
        self.close(state)
