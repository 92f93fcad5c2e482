"""Progress bars (rich), quiet without a terminal; log records print above an open bar."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Bar:
    def __init__(self, progress: Progress | None = None, task: TaskID | None = None, completed: int = 0) -> None:
        self.progress = progress
        self.task = task
        self.n = completed
        self.postfix = ""
        self.latest: dict[str, str] = {}

    def update(self, steps: int = 1) -> None:
        self.n += steps
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=steps)

    def set_postfix(self, **values: str) -> None:
        self.postfix = ", ".join(f"{name}={value}" for name, value in values.items())
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, postfix=self.postfix)


@contextmanager
def _logging_through(streams: dict[int, object]) -> Iterator[None]:
    moved = [(handler, handler.stream) for handler in logging.getLogger().handlers
             if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams]
    for handler, stream in moved:
        handler.setStream(streams[id(stream)])  # type: ignore[arg-type]
    try:
        yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


@contextmanager
def progress_bar(total: int, desc: str, initial: int = 0) -> Iterator[Bar]:
    err, out = sys.stderr, sys.stdout
    if not err.isatty():
        yield Bar(completed=initial)
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[postfix]}"),
                        console=Console(file=err, force_terminal=True, soft_wrap=True), transient=True,
                        redirect_stderr=True, redirect_stdout=out.isatty())
    with progress:
        task = progress.add_task(desc, total=total, completed=initial, postfix="")
        # sys.stderr (and sys.stdout) are rich's proxies while the bar is live
        with _logging_through({id(err): sys.stderr, id(out): sys.stdout}):
            yield Bar(progress, task, completed=initial)


def show_latest(bar: Bar, **values: float | None) -> None:
    """:meth:`Bar.set_postfix` formatted ``.3f``; a missing or non-finite value keeps the last one shown."""
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            bar.latest[name] = f"{value:.3f}"
    if bar.latest:
        bar.set_postfix(**bar.latest)
