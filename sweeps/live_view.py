"""The live view of a running sweep: runs done / running / failed, one line per active run (step, reward,
validation accuracy read from its run store), the warm start's progress and an ETA. In a terminal it redraws in
place (rich); elsewhere (CI, SLURM logs, ``| tee``) it prints one plain line per event (docs/sweeps.md)."""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, METRICS_JSONL, JsonlTail, read_config

SFT_LINE = re.compile(rb"SFT step (\d+)/(\d+)")
PLAIN_MILESTONES = 10  # plain mode prints a run's progress each time it passes another tenth of its steps


class SFTLogTail:
    """The last ``SFT step i/n`` line written to a warm start's log since the last read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = Path(path), 0

    def read(self) -> tuple[int, int] | None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return None
        cut = data.rfind(b"\n") + 1  # keep an unfinished line for the next read
        self.offset += cut
        matches = SFT_LINE.findall(data[:cut])
        return (int(matches[-1][0]), int(matches[-1][1])) if matches else None


def run_total_steps(run_dir: Path) -> int | None:
    try:
        return int((read_config(run_dir) or {})["trainer"]["total_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass
class ActiveRun:
    name: str
    warm_start: bool
    started: float
    total: int | None
    reader: JsonlTail | SFTLogTail
    step: int = 0
    reward: float | None = None
    accuracy: float | None = None
    milestone: int = 0  # plain mode: tenths of the run already announced
    task: TaskID | None = None
    waiting: str | None = None  # launched but queued by a scheduler: why

    def poll(self) -> bool:
        if isinstance(self.reader, SFTLogTail):
            found = self.reader.read()
            if found is None:
                return False
            self.step, self.total = found
            return True
        records = self.reader.read()
        for record in records:
            self.step = max(self.step, int(record["step"]))
            self.reward = _finite(record.get(keys.SCORE_MEAN)) if keys.SCORE_MEAN in record else self.reward
            self.accuracy = _finite(record.get(keys.VAL_ACCURACY)) if keys.VAL_ACCURACY in record else self.accuracy
        return bool(records)

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.step / self.total) if self.total else None

    def describe(self) -> str:
        parts = [f"step {self.step}/{self.total}" if self.total else f"step {self.step}"]
        if self.reward is not None:
            parts.append(f"reward {self.reward:.3f}")
        if self.accuracy is not None:
            parts.append(f"{keys.VAL_ACCURACY} {self.accuracy:.3f}")
        return "  ".join(parts)


def format_duration(seconds: float) -> str:
    """``<1s``, ``45s``, ``12m05s``, ``3h07m``."""
    if seconds < 1:
        return "<1s"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass
class SweepView:
    """``done_before``: runs an earlier invocation completed; ``plain``: default when not a terminal."""

    total: int
    done_before: int = 0
    jobs: int = 1
    console: Console | None = None
    plain: bool | None = None
    clock: Callable[[], float] = time.monotonic
    active: dict[str, ActiveRun] = field(default_factory=dict)
    done: int = 0
    failed: int = 0
    interrupted: int = 0
    walls: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.console = self.console or Console()
        self.plain = not self.console.is_terminal if self.plain is None else self.plain
        self.done = self.done_before
        self.progress: Progress | None = None
        self.overall: TaskID | None = None

    def __enter__(self) -> SweepView:
        if not self.plain:
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                console=self.console, refresh_per_second=4, redirect_stdout=True, redirect_stderr=True)
            self.progress.start()
            self.overall = self.progress.add_task("runs done", total=self.total, completed=self.done,
                                                  info=self.counts(done=False))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.progress is not None:
            self.progress.refresh()
            self.progress.stop()
            self.progress = None

    def started(self, name: str, run_dir: Path | None, log_path: Path, warm_start: bool = False,
                total: int | None = None) -> None:
        """``total``: planned RL steps (else read from the run store's config)."""
        if not warm_start and total is None:
            total = run_total_steps(run_dir)
        run = ActiveRun(name=name, warm_start=warm_start, started=self.clock(), total=total,
                        reader=SFTLogTail(log_path) if warm_start else JsonlTail(Path(run_dir) / METRICS_JSONL))
        self.active[name] = run
        if self.progress is not None:
            run.task = self.progress.add_task(f"warm start {name}" if warm_start else name, total=total, info="starting")
        self._update_overall()

    def finished(self, name: str, state: str) -> None:
        run = self.active.pop(name, None)
        if run is None:
            return
        run.poll()  # the last lines it wrote
        if self.progress is not None and run.task is not None:
            self.progress.update(run.task, completed=run.step, total=run.total, info=self._run_info(run))
            self.progress.refresh()
            self.progress.remove_task(run.task)
        if not run.warm_start:
            if state == COMPLETED:
                self.done += 1
                self.walls.append(self.clock() - run.started)
            elif state == FAILED:
                self.failed += 1
            elif state == INTERRUPTED:
                self.interrupted += 1
        self._update_overall()
        if self.plain and not run.warm_start:
            self.console.print(f"progress: {self.counts()}", highlight=False, soft_wrap=True)

    def waiting(self, name: str, reason: str | None) -> None:
        run = self.active.get(name)
        if run is None or run.waiting == reason:
            return
        run.waiting = reason
        if reason is None:  # its clock starts when it runs, not when it was queued
            run.started = self.clock()
        if self.progress is not None and run.task is not None:
            self.progress.update(run.task, info=f"queued ({reason})" if reason else self._run_info(run))

    def refresh(self) -> None:
        for run in self.active.values():
            if not run.poll():
                continue
            if self.progress is not None and run.task is not None:
                self.progress.update(run.task, completed=run.step, total=run.total, info=self._run_info(run))
            elif self.plain:
                self._plain_milestone(run)
        self._update_overall()

    def counts(self, done: bool = True) -> str:
        """``2/6 done, 2 running, 0 failed, ETA 3m10s`` (no first part when ``done`` is False)."""
        runs = [run for run in self.active.values() if not run.warm_start]
        queued = sum(run.waiting is not None for run in runs)
        text = (f"{self.done}/{self.total} done, " if done else "") + f"{len(runs) - queued} running, " + (
            f"{queued} queued, " if queued else "") + f"{self.failed} failed"
        if self.interrupted:
            text += f", {self.interrupted} interrupted"
        eta = self.eta_seconds()
        not_started = self.total - self.done - self.failed - self.interrupted - len(runs)
        if eta is not None and not_started <= 0 and all(run.fraction == 1.0 for run in runs):  # at the end
            text += ", finishing"
        elif eta is not None:
            text += f", ETA {format_duration(eta)}" + ("" if self.walls else " (from step rates)")
        return text

    def eta_seconds(self) -> float | None:
        """Mean wall time of finished runs (else from step rates) times the work left, over ``jobs``."""
        runs = [run for run in self.active.values() if not run.warm_start]
        now = self.clock()
        per_run = self.walls or [(now - run.started) / run.fraction for run in runs if run.fraction]
        if not per_run:
            return None
        wall = statistics.fmean(per_run)
        queued = max(0, self.total - self.done - self.failed - self.interrupted - len(runs))
        if not runs and not queued:
            return None
        # a run with steps logged has (1 - fraction) of a run left; one without, the mean wall less its age
        left = sum(wall * (1.0 - run.fraction) if run.fraction else max(0.0, wall - (now - run.started))
                   for run in runs)
        return (left + queued * wall) / max(1, min(self.jobs, max(1, queued + len(runs))))

    def _run_info(self, run: ActiveRun) -> str:
        return "" if run.warm_start else "  ".join(part for part in (
            f"reward {run.reward:.3f}" if run.reward is not None else "",
            f"acc {run.accuracy:.3f}" if run.accuracy is not None else "") if part)

    def _plain_milestone(self, run: ActiveRun) -> None:
        if run.fraction is None:
            return
        reached = int(run.fraction * PLAIN_MILESTONES)
        if reached <= run.milestone or reached >= PLAIN_MILESTONES:  # the end is announced by finished()
            return
        run.milestone = reached
        label = f"warm start {run.name}" if run.warm_start else run.name
        self.console.print(f"  {label}: {run.describe()}" + ("" if run.warm_start else f"  ({self.counts()})"),
                           highlight=False, soft_wrap=True)

    def _update_overall(self) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.update(self.overall, completed=self.done, info=self.counts(done=False))
