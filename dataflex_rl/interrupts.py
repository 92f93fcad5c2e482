"""SIGTERM raised as ``KeyboardInterrupt`` (the run is marked interrupted and resumes), and SIGINT/SIGTERM held while
a step's record is written, so a stop never leaves a half-written step."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does."""

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM during the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # Not held: an ignored signal stays ignored, and a handler installed outside Python (None) cannot be put back.
    previous = {signum: handler for signum in HELD_SIGNALS
                if (handler := signal.getsignal(signum)) is not None and handler is not signal.SIG_IGN}

    def hold(signum, frame):  # noqa: ARG001
        if signum not in received:
            received.append(signum)

    for signum in previous:
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in received:  # in arrival order; the first handler that raises ends the delivery
            signal.raise_signal(signum)
