"""The end of a sweep: each run's state, then the report's own per-group summary (so the terminal and ``report.md``
show the same numbers) and the report itself (``analysis.report.build_report``), or the sweep tables with
``report=false``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, PENDING, read_meta
from sweeps.manifest import Manifest
from sweeps.plan import SweepPlan
from sweeps.sweep_config import extra_axes, grid_presets
from sweeps.runner import EXIT_FAILED, readable_status

ENDED_STATES = (COMPLETED, FAILED, INTERRUPTED)
COLOURS = {COMPLETED: "green", FAILED: "red", INTERRUPTED: "yellow"}


def closing_state(run_dir: Path, recorded: str) -> tuple[str, float | None]:
    """sweep.json's state when it says how the run ended, else the run store's; and meta.json's alpha."""
    try:
        alpha = float(read_meta(run_dir)["alpha"])
    except (OSError, ValueError, KeyError, TypeError):
        alpha = None
    status = {} if recorded in ENDED_STATES else readable_status(run_dir) or {}
    state = status.get("state")
    if state not in ENDED_STATES:
        return recorded, alpha
    return (f"{state} at step {status['step']}" if status.get("step") is not None else state), alpha


def run_table(plan: SweepPlan, manifest: Manifest) -> Table:
    columns = []
    if grid_presets(plan.config):
        columns.append(("mechanism", lambda spec: spec.mechanism or ""))
    if plan.config.eta:
        columns.append(("eta", lambda spec: "" if spec.eta is None else f"{spec.eta:g}"))
    for axis in extra_axes(plan.config):
        columns.append((axis.name, lambda spec, name=axis.name: str(spec.extra_factors.get(name, ""))))
    table = Table(title=f"sweep {plan.name}", title_justify="left")
    for index, title in enumerate(("run", "alpha", "seed", *(title for title, _ in columns), "state", "wall time")):
        table.add_column(title, justify="right" if index in (1, 2, len(columns) + 4) else "left")
    for run in plan.runs:
        entry = manifest.previous(run.name) or {}
        state, recorded_alpha = closing_state(run.run_dir, entry.get("state", PENDING))
        alpha = run.spec.alpha if run.spec.alpha is not None else recorded_alpha
        wall = entry.get("wall_time_s")
        table.add_row(run.name, "" if alpha is None else f"{alpha:g}", str(run.spec.seed),
                      *[getter(run.spec) for _, getter in columns],
                      f"[{COLOURS.get(state.split()[0], 'white')}]{state}[/]", "-" if not wall else f"{wall:.1f} s")
    return table


def print_group_summary(sweep_dir: Path, console: Any) -> None:
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


def report_sweep(plan: SweepPlan, manifest: Manifest, exit_code: int, concurrency_note: str,
                 console: Any = None) -> int:
    """Returns the exit status (a report that failed turns 0 into 1)."""
    console = console or Console()
    console.print(run_table(plan, manifest))
    console.print(concurrency_note, highlight=False)
    print_group_summary(plan.sweep_dir, console)
    completed = any((manifest.previous(run.name) or {}).get("state") == COMPLETED for run in plan.runs)
    if plan.config.report and exit_code <= 128 and completed:
        try:
            from analysis.report import build_report

            status, message = 0, f"report: {build_report(plan.sweep_dir)}"
        except Exception as error:  # noqa: BLE001  (a report problem must not hide the runs' results)
            status, message = 1, f"report failed: {type(error).__name__}: {error}"
        print(message, flush=True)
        exit_code = exit_code or (EXIT_FAILED if status else 0)
    elif exit_code <= 128:
        try:
            from analysis.export import export_sweep

            paths = export_sweep(plan.sweep_dir)
            print(f"sweep tables: {paths['metrics']} and {paths['runs']}", flush=True)
        except Exception as error:  # noqa: BLE001  (an export problem must not hide the runs' results)
            print(f"sweep tables skipped: {type(error).__name__}: {error}", flush=True)
    print(f"sweep folder: {plan.sweep_dir}  (sweep.json, launch/, logs/, one run store per run)", flush=True)
    return exit_code
