"""Progress bars (tqdm) that stay quiet when stderr is not a terminal (CI, sweep logs).

In a terminal, log records emitted while a bar is open go through ``tqdm.write`` (tqdm's logging redirect), so a
log line never lands on the bar's own line; postfix values that are logged only now and then (validation accuracy)
keep their last value between updates instead of showing ``nan``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


@contextmanager
def progress_bar(total: int, desc: str, initial: int = 0) -> Iterator[tqdm]:
    """A tqdm bar over ``total`` steps (disabled without a terminal); logging is redirected through it while open."""
    enabled = sys.stderr.isatty()
    with tqdm(total=total, desc=desc, initial=initial, disable=not enabled, dynamic_ncols=True, leave=False) as bar:
        if not enabled:
            yield bar
            return
        with logging_redirect_tqdm():
            yield bar


def show_latest(bar: tqdm, **values: float | None) -> None:
    """``bar.set_postfix`` with each value formatted ``.3f``; a missing or non-finite value keeps the last one shown."""
    latest = bar.__dict__.setdefault("_latest_postfix", {})
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            latest[name] = f"{value:.3f}"
    if latest:
        bar.set_postfix(latest, refresh=False)
