"""Stopping a run cleanly: SIGTERM raised like Ctrl-C, and stops held while a step's record is being written.

The sweep driver, SLURM and Ray stop a run with SIGTERM; :func:`raise_on_sigterm` turns it into the
``KeyboardInterrupt`` a Ctrl-C raises, so the run is marked ``interrupted`` and resumes from its last checkpoint.
A stop that lands inside ``torch.save`` or a metrics write would leave a half-written step and can turn the stop
into a failure (``torch.save`` raises on the zip file it was interrupted in); :func:`held_interrupts` holds
SIGINT and SIGTERM for the length of such a block and delivers them when it ends.
"""

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
    """Hold SIGINT and SIGTERM during the block; each one that arrived is delivered, to the handler that was in
    place before, once the block has ended (also when it raised). Outside the main thread, where Python cannot
    set handlers, the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # Not held: an ignored signal (nohup, a background job) stays ignored, and a handler installed outside Python
    # (None) cannot be put back.
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
