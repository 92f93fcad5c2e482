"""What a sweep shows people: the live view while it runs, the dry-run listing, and at its end the summary
tables and the report (:func:`write_report`: ``analysis.report`` on the sweep folder; the tables show the same
numbers as ``report.md``, :func:`analysis.report.summary_table`).

The live view of a running sweep: runs done / running / failed out of the total, one line per active run (step out
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import METRICS_JSONL, JsonlTail

from sweeps.commands import SweepPlan
from sweeps.grid import RunSpec
from sweeps.launchers import launcher_class
from sweeps.manifest import Manifest

SFT_LINE = re.compile(rb"SFT step (\d+)/(\d+)")
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


def run_total_steps(run_dir: Path | None) -> int | None:
    """A run's total RL steps from its run store's ``config.yaml`` (for a run whose plan did not know them), else
    None."""
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
    waiting: str | None = None  # launched but queued by a scheduler: why

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
    interrupted: int = 0
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
    def started(self, name: str, run_dir: Path | None, log_path: Path, warm_start: bool = False,
                total: int | None = None) -> None:
        """A run (or the warm start, read from its log) was launched; ``total``: its RL steps as planned (else read
        from its run store's config once it writes one)."""
        reader: JsonlTail | SFTLogTail = SFTLogTail(log_path) if warm_start else JsonlTail(
            Path(run_dir) / METRICS_JSONL)
        if not warm_start and total is None:
            total = run_total_steps(run_dir)
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
            elif state == "interrupted":
                self.interrupted += 1
        if self.progress is not None and run.task is not None:
            self.progress.remove_task(run.task)
        self._update_overall()
        if self.plain and not run.warm_start:
            self.console.print(f"progress: {self.counts()}", highlight=False, soft_wrap=True)

    def waiting(self, name: str, reason: str | None) -> None:
        """A launched run waits in a scheduler's queue (``reason``), or runs (None): counted as queued, not
        running, and shown with its reason."""
        run = self.active.get(name)
        if run is None or run.waiting == reason:
            return
        run.waiting = reason
        if reason is None:  # its clock starts when it runs, not when it was queued
            run.started = self.clock()
        if self.progress is not None and run.task is not None:
            self.progress.update(run.task, info=f"queued ({reason})" if reason else self._run_info(run))

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
        """``2/6 done, 2 running, 0 failed, ETA 3m10s`` (without the first part when ``done`` is False; ``, 1
        interrupted`` after the failed ones once a run was stopped)."""
        running = sum(not run.warm_start and run.waiting is None for run in self.active.values())
        queued = sum(not run.warm_start and run.waiting is not None for run in self.active.values())
        text = (f"{self.done}/{self.total} done, " if done else "") + f"{running} running, " + (
            f"{queued} queued, " if queued else "") + f"{self.failed} failed"
        if self.interrupted:
            text += f", {self.interrupted} interrupted"
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
        queued = max(0, self.total - self.ended - len(runs))
        if not runs and not queued:
            return None
        # a run with steps logged has (1 - fraction) of a run left; one without, the mean wall less its age
        left = sum(wall * (1.0 - run.fraction) if run.fraction else max(0.0, wall - (now - run.started))
                   for run in runs)
        return (left + queued * wall) / max(1, min(self.jobs, max(1, queued + len(runs))))

    @property
    def ended(self) -> int:
        """Runs that will not run again in this invocation: done, failed or interrupted."""
        return self.done + self.failed + self.interrupted

    def _at_the_end(self) -> bool:
        """No run left to start and every active one has logged its last step (it is writing its files)."""
        runs = [run for run in self.active.values() if not run.warm_start]
        queued = self.total - self.ended - len(runs)
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


# --- dry run, summary and report ---------------------------------------------------------------------------------
def print_dry_run(plan: SweepPlan) -> None:
    """Every planned command line (warm starts first), for ``dry_run=true``: nothing is started."""
    print(f"sweep {plan.name}: {len(plan.runs)} run(s), {plan.jobs} at once, folder {plan.sweep_dir} (dry run: "
          f"nothing is started)")
    for run in plan.warm_starts:
        print(f"# warm start {run.name}\n{run.shell_line()}")
    for run in plan.runs:
        print(f"# {run.name}\n{run.shell_line()}")


def run_store_alpha(run_dir: Path) -> float | None:
    """The alpha a run recorded in its ``meta.json`` (None before it started)."""
    from dataflex_rl.tracking import run_store

    try:
        return float(run_store.read_meta(run_dir)["alpha"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


ENDED_STATES = ("completed", "failed", "interrupted")


def run_state(run_dir: Path, recorded: str) -> str:
    """A run's state for the closing table: ``recorded`` (sweep.json's) when it says how the run ended, else the
    run store's own (``interrupted at step 15``: a driver stopped hard, by a second Ctrl-C, never recorded the end
    of the runs it stopped, while each run's status.json did)."""
    if recorded in ENDED_STATES:
        return recorded
    from dataflex_rl.tracking.run_store import read_status

    try:
        status = read_status(run_dir) or {}
    except (OSError, ValueError):
        return recorded
    state = status.get("state")
    if state not in ENDED_STATES:
        return recorded
    return f"{state} at step {status['step']}" if status.get("step") is not None else state


def print_summary(plan: SweepPlan, manifest: Manifest, console: Any = None) -> None:
    """Two rich tables: each run's state and wall time, then the report's own per-group summary
    (:func:`analysis.report.summary_table`: accuracy after SFT, final-window mean and interval, paired delta), so the
    terminal and ``report.md`` show the same numbers."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    extra_columns = []
    if plan.config.mechanisms:
        extra_columns.append(("mechanism", lambda spec: spec.mechanism or ""))
    if plan.config.eta:
        extra_columns.append(("eta", lambda spec: "" if spec.eta is None else f"{spec.eta:g}"))
    for axis in plan.config.extra_axes:
        extra_columns.append((axis.name, lambda spec, name=axis.name: str(spec.extra_factors.get(name, ""))))
    table = Table(title=f"sweep {plan.name}", title_justify="left")
    table.add_column("run")
    table.add_column("alpha", justify="right")
    table.add_column("seed", justify="right")
    for title, _ in extra_columns:
        table.add_column(title)
    table.add_column("state")
    table.add_column("wall time", justify="right")
    colours = {"completed": "green", "failed": "red", "interrupted": "yellow"}
    for run in plan.runs:
        entry = manifest.previous(run.name) or {}
        spec: RunSpec = run.spec
        state = run_state(run.run_dir, entry.get("state", "pending"))
        wall = entry.get("wall_time_s")
        alpha = spec.alpha if spec.alpha is not None else run_store_alpha(run.run_dir)  # a preset's own alpha
        table.add_row(run.name, "" if alpha is None else f"{alpha:g}", str(spec.seed),
                      *[getter(spec) for _, getter in extra_columns],
                      f"[{colours.get(state.split()[0], 'white')}]{state}[/]",
                      "-" if not wall else f"{wall:.1f} s")
    console.print(table)
    console.print(f"{plan.jobs} run(s) at once, {thread_note(plan)}", highlight=False)
    print_group_summary(plan.sweep_dir, console)


def thread_note(plan: SweepPlan) -> str:
    """How many threads each run used and where that number came from."""
    if plan.threads is None:
        return "threads per run left to the backend"
    launcher = launcher_class(plan.config.launcher)
    origin = "threads=" if plan.config.threads else (
        launcher.threads_origin if launcher.threads_per_run(plan.config.launcher_settings) else "default")
    return f"{plan.threads} thread(s) per run ({origin})"


def print_group_summary(sweep_dir: Path, console: Any) -> None:
    """The report's per-group summary table of the sweep's completed runs (nothing when there is none yet)."""
    try:
        from analysis.load import load_sweep
        from analysis.report import summary_table
        from analysis.tables import to_rich
        from analysis.warm_starts import design_sentence

        data = load_sweep(sweep_dir, histograms=False)
        summary = summary_table(data)
    except Exception as error:  # noqa: BLE001  (a summary problem must not hide the runs' states)
        console.print(f"summary table skipped: {type(error).__name__}: {error}", highlight=False)
        return
    if summary is not None:
        rendered = to_rich(summary)
        if not console.is_terminal:  # a log file has no width to respect: never crop a value
            wide = console.options.update_width(1000)
            console.width = max(console.width, console.measure(rendered, options=wide).maximum)
        console.print(rendered)
        console.print(design_sentence(data), highlight=False)


def write_report(sweep_dir: Path) -> tuple[bool, str]:
    """``analysis.report`` on the sweep folder; (whether it failed, a line saying what happened). Skipped, not
    failed, when the analysis package is missing."""
    try:
        from analysis.report import main as report_main
    except ImportError as error:
        return False, f"report skipped: the analysis package is not importable ({error})"
    try:
        status = report_main([str(sweep_dir)])
    except Exception as error:  # noqa: BLE001  (a report problem must not hide the runs' results)
        return True, f"report failed: {type(error).__name__}: {error}"
    if status:
        return True, f"report failed (exit status {status})"
    return False, f"report: {sweep_dir / 'report' / 'report.md'}"


def write_exports(sweep_dir: Path) -> str:
    """``analysis.export`` on the sweep folder (the report writes them too); returns a line saying what happened."""
    try:
        from analysis.export import export_sweep

        paths = export_sweep(sweep_dir)
    except Exception as error:  # noqa: BLE001  (an export problem must not hide the runs' results)
        return f"sweep tables skipped: {type(error).__name__}: {error}"
    return f"sweep tables: {paths['metrics']} and {paths['runs']}"


def summary_rows(manifest_data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """(run, alpha, seed, state, exit_code) of every run in a sweep.json, for scripts and tests."""
    return [{key: entry.get(key) for key in ("run", "alpha", "seed", "state", "exit_code")}
            for entry in manifest_data.get("runs", [])]
