"""What a sweep prints and writes at its end: the dry-run listing, the summary tables and the report.

The tables show the same numbers as ``report.md`` (:func:`analysis.report.summary_table`); the report is written by
``analysis.report`` on the sweep folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeps.grid import RunSpec, grid_description
from sweeps.launchers import launcher_class
from sweeps.manifest import Manifest
from sweeps.runner import EXIT_FAILED, SweepPlan


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
    axis_keys = list(grid_description(plan.config)["axes"])
    for key in axis_keys:
        extra_columns.append((key, lambda spec, key=key: spec.axes.get(key, "")))
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
        state = entry.get("state", "pending")
        wall = entry.get("wall_time_s")
        alpha = spec.alpha if spec.alpha is not None else run_store_alpha(run.run_dir)  # a preset's own alpha
        table.add_row(run.name, "" if alpha is None else f"{alpha:g}", str(spec.seed),
                      *[getter(spec) for _, getter in extra_columns],
                      f"[{colours.get(state, 'white')}]{state}[/]",
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

        summary = summary_table(load_sweep(sweep_dir, histograms=False))
    except Exception as error:  # noqa: BLE001  (a summary problem must not hide the runs' states)
        console.print(f"summary table skipped: {type(error).__name__}: {error}", highlight=False)
        return
    if summary is not None:
        rendered = to_rich(summary)
        if not console.is_terminal:  # a log file has no width to respect: never crop a value
            wide = console.options.update_width(1000)
            console.width = max(console.width, console.measure(rendered, options=wide).maximum)
        console.print(rendered)


def write_report(sweep_dir: Path) -> tuple[int, str]:
    """``analysis.report`` on the sweep folder; (exit status, message). Skipped when the package is missing."""
    try:
        from analysis.report import main as report_main
    except ImportError as error:
        return 0, f"report skipped: the analysis package is not importable ({error})"
    try:
        status = report_main([str(sweep_dir)])
    except Exception as error:  # noqa: BLE001  (a report problem must not hide the runs' results)
        return EXIT_FAILED, f"report failed: {type(error).__name__}: {error}"
    if status:
        return status, f"report failed (exit status {status})"
    return 0, f"report: {sweep_dir / 'report' / 'report.md'}"


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
