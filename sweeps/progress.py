"""Live view of a running sweep: runs done / running / failed out of the total, one line per active run (step out
of total steps, latest reward and validation accuracy, read from its run store), the SFT warm start's own progress,
and an ETA from the runs finished so far.

In a terminal the view is a :class:`rich.progress.Progress` display that redraws in place (the driver's own
``started``/``completed`` lines print above it). Without one (CI, SLURM logs, ``| tee``) it prints one plain line
per event instead: a run started or ended, a run or the warm start passing each tenth of its steps.

The view only reads files: a run's ``metrics.jsonl`` (the run store's line-flushed log, read incrementally from the
last offset) and the warm start's log (its ``SFT step i/n`` lines). The two small readers below are the only
places that know those formats.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import METRICS_JSONL, JsonlTail

SFT_LINE = re.compile(rb"SFT step (\d+)/(\d+)")
TOTAL_STEPS_OVERRIDES = ("trainer.total_steps=", "trainer.total_training_steps=")
PLAIN_MILESTONES = 10  # plain mode prints a run's progress each time it passes another tenth of its steps


# --- run store readers -------------------------------------------------------------------------------------------
class SFTLogTail:
    """The last ``SFT step i/n`` line written to a warm start's log since the last :meth:`read`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> tuple[int, int] | None:
        """``(step, total)`` of the newest SFT progress line, or None when no new one was written."""
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


def planned_total_steps(command: Sequence[str], run_dir: Path | None,
                        config: Mapping[str, Any] | None = None) -> int | None:
    """A run's total RL steps: from its resolved ``config`` (a local run the driver composed), else its
    ``trainer.total_steps=N`` override (a verl run, or a command that carries its overrides), else its run store's
    ``config.yaml``."""
    if config is not None:
        return _config_total_steps(config)
    for argument in reversed(command):
        for prefix in TOTAL_STEPS_OVERRIDES:
            if argument.lstrip("+").startswith(prefix):
                try:
                    return int(argument.split("=", 1)[1])
                except ValueError:
                    return None
    if run_dir is None:
        return None
    from dataflex_rl.tracking.run_store import read_config

    try:
        return _config_total_steps(read_config(run_dir) or {})
    except (OSError, ValueError):
        return None


def _config_total_steps(config: Mapping[str, Any]) -> int | None:
    """``trainer.total_steps`` of a resolved train config, or None when it has none."""
    try:
        return int(config["trainer"]["total_steps"])
    except (KeyError, TypeError, ValueError):
        return None


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


# --- state -------------------------------------------------------------------------------------------------------
@dataclass
class ActiveRun:
    """What the view knows about one running run (or the warm start)."""

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

    def poll(self) -> bool:
        """Read what the run wrote since the last poll; True when something changed."""
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
        """Steps done over steps planned (None before the total is known)."""
        return min(1.0, self.step / self.total) if self.total else None

    def describe(self) -> str:
        """``step 60/120  reward 0.512  val/accuracy 0.580`` (the parts known so far)."""
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
    """The live view; the driver calls :meth:`started`, :meth:`finished` and :meth:`refresh` (every poll).

    ``total``: runs in the sweep; ``done_before``: those already completed by an earlier invocation (counted done,
    not used for the ETA); ``jobs``: runs at once (the ETA divides the remaining work among them).
    ``console``: where to draw (default stdout); ``plain``: force plain lines (default: when not a terminal).
    """

    total: int
    done_before: int = 0
    jobs: int = 1
    console: Console | None = None
    plain: bool | None = None
    clock: Callable[[], float] = time.monotonic
    active: dict[str, ActiveRun] = field(default_factory=dict)
    done: int = 0
    failed: int = 0
    walls: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.console = self.console or Console()
        if self.plain is None:
            self.plain = not self.console.is_terminal
        self.done = self.done_before
        self.progress: Progress | None = None
        self.overall: TaskID | None = None

    # lifecycle
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

    # events
    def started(self, name: str, command: Sequence[str], run_dir: Path | None, log_path: Path,
                warm_start: bool = False, config: Mapping[str, Any] | None = None) -> None:
        """A run (or the warm start, read from its log) was launched; ``config``: its resolved config, when the
        driver composed it."""
        reader: JsonlTail | SFTLogTail = SFTLogTail(log_path) if warm_start else JsonlTail(
            Path(run_dir) / METRICS_JSONL)
        total = None if warm_start else planned_total_steps(command, run_dir, config)
        run = ActiveRun(name=name, warm_start=warm_start, started=self.clock(), total=total, reader=reader)
        self.active[name] = run
        if self.progress is not None:
            label = "SFT warm start" if warm_start else name
            run.task = self.progress.add_task(label, total=total, info="starting")
        self._update_overall()

    def finished(self, name: str, state: str) -> None:
        """A run ended in ``state`` (completed, failed, interrupted)."""
        run = self.active.pop(name, None)
        if run is None:
            return
        run.poll()  # the last lines it wrote
        if self.progress is not None and run.task is not None:
            self.progress.update(run.task, completed=run.step, total=run.total, info=self._run_info(run))
            self.progress.refresh()
        if not run.warm_start:
            if state == "completed":
                self.done += 1
                self.walls.append(self.clock() - run.started)
            elif state == "failed":
                self.failed += 1
        if self.progress is not None and run.task is not None:
            self.progress.remove_task(run.task)
        self._update_overall()
        if self.plain and not run.warm_start:
            self.console.print(f"progress: {self.counts()}", highlight=False, soft_wrap=True)

    def refresh(self) -> None:
        """Read every active run's new records and redraw (terminal) or print passed milestones (plain)."""
        for run in self.active.values():
            if not run.poll():
                continue
            if self.progress is not None and run.task is not None:
                self.progress.update(run.task, completed=run.step, total=run.total, info=self._run_info(run))
            elif self.plain:
                self._plain_milestone(run)
        self._update_overall()

    # text
    def counts(self, done: bool = True) -> str:
        """``2/6 done, 2 running, 0 failed, ETA 3m10s`` (without the first part when ``done`` is False)."""
        running = sum(not run.warm_start for run in self.active.values())
        text = (f"{self.done}/{self.total} done, " if done else "") + f"{running} running, {self.failed} failed"
        eta = self.eta_seconds()
        if eta is not None and self._at_the_end():
            text += ", finishing"
        elif eta is not None:
            text += f", ETA {format_duration(eta)}" + ("" if self.walls else " (from step rates)")
        return text

    def eta_seconds(self) -> float | None:
        """Seconds until every run has ended: the mean wall time of the runs finished in this invocation (before
        the first one, each active run's elapsed time / its fraction done) times the work left, over ``jobs``."""
        runs = [run for run in self.active.values() if not run.warm_start]
        now = self.clock()
        per_run = list(self.walls)
        if not per_run:
            per_run = [(now - run.started) / run.fraction for run in runs if run.fraction]
        if not per_run:
            return None
        wall = statistics.fmean(per_run)
        queued = max(0, self.total - self.done - self.failed - len(runs))
        if not runs and not queued:
            return None
        # a run with steps logged has (1 - fraction) of a run left; one without, the mean wall less its age
        left = sum(wall * (1.0 - run.fraction) if run.fraction else max(0.0, wall - (now - run.started))
                   for run in runs)
        return (left + queued * wall) / max(1, min(self.jobs, max(1, queued + len(runs))))

    def _at_the_end(self) -> bool:
        """No run left to start and every active one has logged its last step (it is writing its files)."""
        runs = [run for run in self.active.values() if not run.warm_start]
        queued = self.total - self.done - self.failed - len(runs)
        return queued <= 0 and all(run.fraction == 1.0 for run in runs)

    def _run_info(self, run: ActiveRun) -> str:
        if run.warm_start:
            return ""
        return "  ".join(part for part in (
            f"reward {run.reward:.3f}" if run.reward is not None else "",
            f"acc {run.accuracy:.3f}" if run.accuracy is not None else "") if part)

    def _plain_milestone(self, run: ActiveRun) -> None:
        if run.fraction is None:
            return
        reached = int(run.fraction * PLAIN_MILESTONES)
        if reached <= run.milestone or reached >= PLAIN_MILESTONES:  # the end is announced by finished()
            return
        run.milestone = reached
        label = "SFT warm start" if run.warm_start else run.name
        self.console.print(f"  {label}: {run.describe()}" + ("" if run.warm_start else f"  ({self.counts()})"),
                           highlight=False, soft_wrap=True)

    def _update_overall(self) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.update(self.overall, completed=self.done, info=self.counts(done=False))

