"""Sweep report: ``python -m analysis.report runs/<sweep> [--out DIR] [--metric KEY ...]``.

Writes into ``runs/<sweep>/report/`` (or ``--out``):

- ``report.md`` (and ``report.html``, the same page for a browser): the summary table, runs per group, excluded runs
  with their state and error, the comparison tables (final-window mean and time-averaged AUC, with paired deltas
  against the baseline), what each comparison could detect (MDE, seeds needed for a target difference), the split of
  each group's variance into evaluation and training noise, the seed plan of a planned sweep, the figures as
  relative PNG links, and where in training the groups differ (per-step paired differences against the baseline with
  a simultaneous band, :mod:`analysis.curves`, and mean / IQM sample-efficiency curves);
- ``table_final_window.{md,csv,tex,html}``, ``table_auc.{md,csv,tex,html}`` (CSV = the numbers behind the table);
- ``fig_*.png`` (200 dpi) and ``fig_*.pdf`` (vector); ``runs.csv`` (the run table, config columns included).

Sections whose data the sweep lacks (no histograms, no gradient statistics, ...) are skipped with a line saying so;
a figure that cannot be drawn leaves its error in the report instead of stopping it; failed or unfinished runs are
excluded by the loader and listed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from analysis import plots
from analysis.aggregate import (
    DEFAULT_FINAL_WINDOW,
    aggregate_runs,
    default_baseline,
    default_group_keys,
    metric_direction,
    paired_differences,
    run_summaries,
)
from analysis.bootstrap import DEFAULT_BOOTSTRAP, MIN_BOOTSTRAP_N
from analysis.curves import BAND_METHOD, MEASURED_BAND_COVERAGE, curve_differences
from analysis.export import write_sweep_tables
from analysis.groups import group_key
from analysis.html_report import write_report_html
from analysis.load import IDENTITY_COLUMNS, SeveralSweepsError, SweepData, add_run_columns, check_one_sweep, load_sweep
from analysis.power import plan_section, power_section, variance_section
from analysis.statistics import DEFAULT_CONFIDENCE, DEFAULT_LEVEL, DEFAULT_POWER, MIN_SEEDS_FOR_INTERVAL
from analysis.tables import TABLE_STYLES, ComparisonTable, comparison_table, to_markdown, write_table
from dataflex_rl import keys

logger = logging.getLogger(__name__)

DEFAULT_METRICS: tuple[str, ...] = (keys.VAL_ACCURACY, keys.SCORE_MEAN, keys.TRAIN_ACCURACY, keys.RESPONSE_LENGTH_MEAN)
CURVE_METRICS: tuple[tuple[str, str], ...] = ((keys.VAL_ACCURACY, "Validation accuracy"), (keys.SCORE_MEAN, "Reward"))
TABLE_VALUES: tuple[tuple[str, str], ...] = (
    ("final_window", "Final-window mean"), ("auc", "Area under the curve (time-averaged value)"))


@dataclass(frozen=True)
class ReportOptions:
    """Everything that shapes a report; the defaults are the CLI's defaults."""

    metrics: tuple[str, ...] | None = None  # None: those of DEFAULT_METRICS present in the sweep
    group_keys: tuple[str, ...] | None = None  # None: default_group_keys(runs)
    final_window: int = DEFAULT_FINAL_WINDOW
    confidence: float = DEFAULT_CONFIDENCE
    n_bootstrap: int = DEFAULT_BOOTSTRAP
    random_state: int = 0
    style: str = "pm"
    thresholds: Mapping[str, float] = field(default_factory=dict)
    include_incomplete: bool = False
    target_effect: float = 0.01  # "to detect E you need N seeds" (a planned sweep's target_mde takes precedence)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


def _save(figure: Figure, out_dir: Path, name: str) -> str:
    """``fig_<name>.png`` (200 dpi) and ``fig_<name>.pdf`` (vector, for a paper); returns the PNG's name."""
    return plots.save_figure(figure, out_dir / f"fig_{name}")[0].name


class _Document:
    """Markdown lines plus a helper that draws one figure section without letting a failure stop the report."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.lines: list[str] = []
        self.figures: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, title: str, name: str, draw: Callable[[Figure], None], size: tuple[float, float] = (6.4, 4.2)) -> None:
        self.add(f"### {title}", "")
        figure = Figure(figsize=size, layout="constrained")
        try:
            draw(figure)
            file_name = _save(figure, self.out_dir, name)
        except Exception as exc:
            logger.warning("figure %r failed: %s", name, exc, exc_info=True)
            self.add(f"_Could not draw this figure: {type(exc).__name__}: {exc}_", "")
            return
        self.figures.append(file_name)
        self.add(f"![{title}]({file_name})", "", f"Vector version: [{Path(file_name).stem}.pdf]"
                 f"({Path(file_name).stem}.pdf).", "")


SUMMARY_METRIC = keys.VAL_ACCURACY


def summary_columns(metric: str, final_window: int) -> tuple[str, str]:
    """Titles of the summary table's two value columns: ``metric`` after SFT and at the end of training."""
    return f"{metric} after SFT (step 0)", f"{metric} final (mean of the last {final_window})"


def summary_table(data: SweepData, options: ReportOptions = ReportOptions(),
                  metric: str = SUMMARY_METRIC) -> ComparisonTable | None:
    """The sweep's headline table, one row per group: ``metric`` after SFT (each run's step-0 evaluation, of the
    shared warm start), its final-window mean with interval (n) and the paired delta against the baseline. It heads
    ``report.md`` and is what the sweep driver prints at the end, so the two never disagree. None when no included
    run logged ``metric``."""
    if metric not in set(data.metric_names):
        return None
    group_keys = tuple(options.group_keys or default_group_keys(data.included_runs))
    metrics = data.metrics
    extra_keys = [k for k in group_keys if k not in IDENTITY_COLUMNS]
    if extra_keys:
        metrics = add_run_columns(metrics, data.runs, extra_keys)
    after_title, final_title = summary_columns(metric, options.final_window)
    final = run_summaries(metrics, metrics=[metric], final_window=options.final_window)
    # the step-0 value as a one-point summary of its own, so both columns go through the same aggregation
    at_start = metrics[(metrics["metric"].astype(str) == metric).to_numpy() & (metrics["step"] == 0).to_numpy()]
    after_sft = run_summaries(at_start, final_window=1) if len(at_start) else final.iloc[:0]
    summaries = pd.concat([after_sft.assign(metric=after_title), final.assign(metric=final_title)],
                          ignore_index=True)
    statistics = {"confidence": options.confidence, "n_bootstrap": options.n_bootstrap,
                  "random_state": options.random_state}
    baseline = default_baseline(final, group_keys)
    # the renamed columns keep the metric's direction (which group is best, which delta is an improvement)
    direction = metric_direction(metric)
    minimize, maximize = ([final_title], []) if direction < 0 else ([], [final_title] if direction > 0 else [])
    deltas = None if baseline is None else paired_differences(
        summaries[summaries["metric"] == final_title], group_keys=group_keys, baseline=baseline, minimize=minimize,
        **statistics)
    aggregates = aggregate_runs(summaries, group_keys=group_keys, **statistics)
    present = [title for title in (after_title, final_title) if title in set(aggregates["metric"])]
    table = comparison_table(aggregates, deltas=deltas, metrics=present, group_keys=group_keys, style=options.style,
                             minimize=minimize, maximize=maximize,
                             caption=f"{metric} after SFT and at the end of training, per group")
    if after_title in table.best:  # the shared warm start has no best group
        table.best[after_title] = False
    return table


def _runs_overview(data: SweepData, group_keys: Sequence[str]) -> pd.DataFrame:
    runs = data.runs
    included = runs[runs["included"]]
    if included.empty:
        return pd.DataFrame()
    overview = included.groupby(list(group_keys), dropna=False, sort=True, observed=True).agg(
        runs=("run", "count"), seeds=("seed", lambda s: ", ".join(str(v) for v in sorted(s.dropna()))))
    return overview.reset_index()


def _excluded_table(data: SweepData) -> pd.DataFrame:
    excluded = data.excluded_runs
    return excluded[["run", "alpha", "seed", "state", "exclusion_reason"]].rename(
        columns={"exclusion_reason": "reason"}).reset_index(drop=True)


# Files a report folder holds (what write_report writes); only a folder of these is replaced whole.
REPORT_FILES = ("report.md", "report.html", "runs.csv", "table_*", "fig_*")


def _is_report_folder(folder: Path) -> bool:
    import fnmatch

    return all(entry.is_file() and any(fnmatch.fnmatch(entry.name, pattern) for pattern in REPORT_FILES)
               for entry in folder.iterdir())


def write_report(data: SweepData, out_dir: str | os.PathLike[str], options: ReportOptions = ReportOptions()) -> Path:
    """Write the report of already loaded sweep data into ``out_dir``; return the path of ``report.md``.

    The report is written into a hidden folder beside ``out_dir`` and swapped in when complete, so a report stopped
    half way (a kill, a full disk) leaves the previous report whole and no empty figure beside it. An ``out_dir``
    holding files a report does not write is written in place instead (nothing of it is removed)."""
    import shutil
    import tempfile

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.is_dir() and not _is_report_folder(out_dir):
        return _write_report_files(data, out_dir, options)
    for stale in out_dir.parent.glob(f".{out_dir.name}.*.partial"):  # left by a report that was killed
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    try:
        _write_report_files(data, staging, options)
        staging.chmod(0o777 & ~_umask())
        previous = out_dir.parent / f".{out_dir.name}.{staging.name.split('.')[-2]}.old.partial"
        if out_dir.exists():
            os.replace(out_dir, previous)
        os.replace(staging, out_dir)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.md"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_report_files(data: SweepData, out_dir: Path, options: ReportOptions) -> Path:
    """Every file of the report, into ``out_dir``; returns ``report.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    document = _Document(out_dir)
    group_keys = tuple(options.group_keys or default_group_keys(data.included_runs))
    data = _with_group_columns(data, group_keys)
    _header_section(document, data, group_keys, options)
    _warning_section(document, data)
    data.runs.to_csv(out_dir / "runs.csv", index=False)
    _runs_sections(document, data, group_keys, options)
    table_metrics = _table_metrics(document, data, options)
    summaries = None
    if table_metrics:
        summaries = run_summaries(data.metrics, metrics=table_metrics, final_window=options.final_window,
                                  thresholds=dict(options.thresholds))
        _table_sections(document, summaries, table_metrics, group_keys, options)
        _power_sections(document, data, summaries, table_metrics, group_keys, options)
    else:
        document.add("## Tables", "", "Skipped: none of the table metrics is present.", "")
    document.add("## Figures", "")
    _figure_sections(document, data, summaries, table_metrics, group_keys, options)
    _where_groups_differ_section(document, data, table_metrics, group_keys, options)
    report_path = out_dir / "report.md"
    report_path.write_text("\n".join(document.lines).rstrip() + "\n")
    write_report_html(report_path)
    return report_path


def _with_group_columns(data: SweepData, group_keys: Sequence[str]) -> SweepData:
    """``data`` with the group keys that are run-table columns only (``config.<key>`` as a factor) copied onto the
    metrics and histogram tables the report groups; raises when a group key is not a run-table column."""
    unknown = [k for k in group_keys if k not in data.runs.columns]
    if unknown:
        raise KeyError(f"group keys {unknown} are not run-table columns; use identity columns such as alpha, "
                       f"mechanism_label, backend, or config.<key> columns")
    extra_keys = [k for k in group_keys if k not in IDENTITY_COLUMNS]
    if not extra_keys:
        return data
    return SweepData(runs=data.runs, metrics=add_run_columns(data.metrics, data.runs, extra_keys),
                     histograms=add_run_columns(data.histograms, data.runs, extra_keys) if len(data.histograms)
                     else data.histograms, manifest=data.manifest, source=data.source)


def _header_section(document: _Document, data: SweepData, group_keys: Sequence[str], options: ReportOptions) -> None:
    """Title, source, run counts and how to read the tables."""
    sweep_names = sorted(data.runs["sweep"].astype(str).unique()) if len(data.runs) else ["(empty)"]
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    n_included = int(data.runs["included"].sum())
    document.add(
        f"# Sweep report: {', '.join(sweep_names)}", "",
        f"Source: `{data.source}`. Generated {generated}.", "",
        f"Runs: {n_included} included, {len(data.runs) - n_included} excluded. Groups: {', '.join(group_keys)}.", "",
        f"Per-run values: final window = mean of the last {options.final_window} logged values of a metric; AUC = "
        "trapezoid area over steps divided by the run's step span.", "",
        "How to read the tables:", "",
        f"- Cells: mean ± half-width of the {options.confidence:.0%} Student-t interval over seeds (n runs). Below "
        f"{MIN_SEEDS_FOR_INTERVAL} seeds no interval is printed (\"too few seeds\"): a range of 2 values is no "
        "confidence interval.",
        f"- Δ: mean difference against the baseline paired by seed, [{options.confidence:.0%} paired-t interval], "
        "paired t-test p-value (with several groups against one baseline, also Holm-adjusted), MDE = the smallest "
        f"|Δ| this many seeds detect with {DEFAULT_POWER:.0%} power at a two-sided {DEFAULT_LEVEL:g} level, from the "
        "spread of the paired differences.",
        "- **Bold**: a Δ whose paired interval excludes 0. Nothing else is bold; no group mean is marked best.",
        f"- IQM and probability-of-improvement intervals (CSV columns) are BCa bootstrap intervals "
        f"(`scipy.stats.bootstrap`, {options.n_bootstrap} resamples, random_state {options.random_state}), given "
        f"from {MIN_BOOTSTRAP_N} seeds on (below, the bootstrap undercovers).", "",
    )


def run_lengths(data: SweepData) -> dict[str, int]:
    """run -> the last step it logged, for every included run with metrics."""
    if not len(data.metrics):
        return {}
    return {str(run): int(step) for run, step in
            data.metrics.groupby(data.metrics["run"].astype(str), observed=True)["step"].max().items()}


def runs_without(data: SweepData, metric: str) -> list[str]:
    """Included runs that logged no finite value of ``metric`` while others did (they drop out of its n)."""
    included = [str(run) for run in data.included_runs["run"]]
    rows = data.metrics[data.metrics["metric"].astype(str) == metric]
    if not len(rows):
        return []
    have = set(rows["run"].astype(str))
    return [run for run in included if run not in have]


def _warning_section(document: _Document, data: SweepData) -> None:
    """What makes the comparisons weaker than they look: runs of different lengths, runs without a table metric."""
    lines = []
    lengths = run_lengths(data)
    if len(set(lengths.values())) > 1:
        by_length: dict[int, list[str]] = {}
        for run, step in sorted(lengths.items()):
            by_length.setdefault(step, []).append(run)
        listed = "; ".join(f"{step} steps: {', '.join(runs[:4])}{' ...' if len(runs) > 4 else ''}"
                           for step, runs in sorted(by_length.items()))
        lines.append(f"- **Runs of different lengths are compared**: {listed}. Final windows and AUCs of runs "
                     "that end at different steps are not comparable; rerun the short ones to the same length "
                     "(a larger `steps` resumes them).")
    for metric in DEFAULT_METRICS:
        missing = runs_without(data, metric)
        if missing:
            lines.append(f"- {len(missing)} included run(s) logged no finite `{metric}`, so they are left out of its "
                         f"n: {', '.join(missing)}.")
    if lines:
        document.add("## Warnings", "", *lines, "")


def _runs_sections(document: _Document, data: SweepData, group_keys: Sequence[str], options: ReportOptions) -> None:
    """The summary table, the included runs per group and the excluded runs with their reasons."""
    headline = summary_table(data, options)
    if headline is not None:
        document.add("## Summary", "", to_markdown(headline), "",
                     "The sweep driver prints this same table at the end of a sweep.", "")
    document.add("## Runs", "")
    overview = _runs_overview(data, group_keys)
    document.add(to_markdown_frame(overview) if not overview.empty else "No completed runs.", "")
    document.add("## Excluded runs", "")
    excluded = _excluded_table(data)
    if excluded.empty:
        document.add("None: every run completed.", "")
    else:
        document.add(f"{len(excluded)} run(s) left out of every aggregate:", "", to_markdown_frame(excluded), "")


def _table_metrics(document: _Document, data: SweepData, options: ReportOptions) -> list[str]:
    """The requested (else default) table metrics that are logged; the others are named in the report."""
    available = set(data.metric_names)
    requested = list(options.metrics) if options.metrics else [m for m in DEFAULT_METRICS if m in available]
    missing = [m for m in requested if m not in available]
    if missing:
        document.add(f"Metrics not logged by any included run (left out): {', '.join(missing)}.", "")
    return [m for m in requested if m in available]


def _power_sections(document: _Document, data: SweepData, summaries: pd.DataFrame, table_metrics: Sequence[str],
                    group_keys: Sequence[str], options: ReportOptions) -> None:
    """What each comparison of the primary metric can detect, its variance split and the sweep's seed plan."""
    primary = keys.VAL_ACCURACY if keys.VAL_ACCURACY in table_metrics else table_metrics[0]
    plan = (data.manifest or {}).get("plan")
    target = float(plan["target_mde"]) if plan and plan.get("target_mde") else options.target_effect
    power_section(document.add, summaries, primary, group_keys, target, options.confidence)
    variance_section(document.add, summaries, data.runs, primary, group_keys)
    if plan:
        plan_section(document.add, plan, summaries, group_keys, options.confidence)


def to_markdown_frame(frame: pd.DataFrame) -> str:
    """A plain DataFrame as a Markdown table (floats in ``%g``)."""
    shown = frame.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column].dtype):
            shown[column] = [f"{v:g}" for v in shown[column]]
    return shown.to_markdown(index=False)


def _table_sections(
    document: _Document, summaries: pd.DataFrame, metrics: Sequence[str], group_keys: Sequence[str],
    options: ReportOptions,
) -> None:
    baseline = default_baseline(summaries, group_keys)
    for value, title in TABLE_VALUES:
        document.add(f"## {title}", "")
        aggregates = aggregate_runs(summaries, value=value, group_keys=group_keys, confidence=options.confidence,
                                    n_bootstrap=options.n_bootstrap, random_state=options.random_state)
        deltas = None
        if baseline is None:
            document.add("No deltas: no single baseline group (alpha = 0 or mechanism label `baseline`).", "")
        else:
            deltas = paired_differences(summaries, value=value, group_keys=group_keys, baseline=baseline,
                                        confidence=options.confidence, n_bootstrap=options.n_bootstrap,
                                        random_state=options.random_state)
            shown = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in baseline.items())
            within = [key for key in group_keys if key not in baseline]
            document.add(f"Baseline: {shown}" + (f", at the same {', '.join(within)}" if within else "") + ".", "")
        table = comparison_table(aggregates, deltas=deltas, metrics=metrics, group_keys=group_keys,
                                 style=options.style, caption=f"{title} per group")
        files = write_table(table, document.out_dir, f"table_{value}")
        document.add(to_markdown(table), "",
                     "Files: " + ", ".join(f"[{fmt}]({path.name})" for fmt, path in files.items()), "")
    if options.thresholds:
        document.add("## Steps to threshold", "")
        reached = aggregate_runs(summaries[summaries["metric"].isin(list(options.thresholds))],
                                 value="steps_to_threshold", group_keys=group_keys, confidence=options.confidence,
                                 n_bootstrap=options.n_bootstrap, random_state=options.random_state)
        document.add("First step at which a run reached the threshold; n counts the runs that reached it.", "",
                     to_markdown(comparison_table(reached, group_keys=group_keys, style=options.style, digits=1,
                                                  minimize=set(options.thresholds))), "")


SMOOTHING = 0.9  # EMA factor of per-step curves in the report (W&B's default range); sparse curves are not smoothed
SMOOTH_MIN_POINTS = 50


def curve_smoothing(long: pd.DataFrame, metric: str) -> float | None:
    """:data:`SMOOTHING` for a metric logged at least :data:`SMOOTH_MIN_POINTS` times per run (per-step training
    statistics), None for sparse ones (validation accuracy every N steps), whose every point is a measurement."""
    rows = long[long["metric"].astype(str) == metric]
    points = rows.groupby(rows["run"].astype(str))["step"].size()
    return SMOOTHING if len(points) and points.median() >= SMOOTH_MIN_POINTS else None


def _figure_sections(
    document: _Document, data: SweepData, summaries: pd.DataFrame | None, table_metrics: Sequence[str],
    group_keys: Sequence[str], options: ReportOptions,
) -> None:
    """Every figure section, in order: curves, final metric against alpha, histograms, gradient statistics, the
    low-probability share. A figure whose data is missing gets a line saying why it is skipped."""
    _curve_figures(document, data, table_metrics, group_keys, options)
    _final_metric_figure(document, data, summaries, table_metrics, group_keys, options)
    _histogram_figures(document, data, group_keys)
    _gradient_figures(document, data, group_keys, options)
    _prob_change_figures(document, data, group_keys, options)
    _low_prob_share_figure(document, data, group_keys, options)


def _curve_figures(document: _Document, data: SweepData, table_metrics: Sequence[str], group_keys: Sequence[str],
                   options: ReportOptions) -> None:
    """One curve figure per metric of :data:`CURVE_METRICS` and of the tables; a metric equal to one drawn above at
    every step of every run is not drawn again."""
    available = set(data.metric_names)
    curve_metrics = list(dict.fromkeys([*(m for m, _ in CURVE_METRICS), *table_metrics]))
    titles = dict(CURVE_METRICS)
    duplicates = plots.identical_metrics(data.metrics, [m for m in curve_metrics if m in available])
    for metric in curve_metrics:
        title = titles.get(metric, plots.metric_label(metric))
        if metric not in available:
            document.add(f"### {title}", "", f"Skipped: `{metric}` is not logged.", "")
            continue
        if metric in duplicates:
            document.add(f"### {title}", "", f"Not drawn: `{metric}` equals `{duplicates[metric]}` at every step of "
                         "every run (drawn once above).", "")
            continue
        document.figure(title, f"curve_{_slug(metric)}", lambda figure, m=metric: plots.plot_curves(
            data.metrics, m, group_keys=group_keys, ax=figure.add_subplot(), confidence=options.confidence,
            random_state=options.random_state, smoothing=curve_smoothing(data.metrics, m)))


def _final_metric_figure(document: _Document, data: SweepData, summaries: pd.DataFrame | None,
                         table_metrics: Sequence[str], group_keys: Sequence[str], options: ReportOptions) -> None:
    """The final value of the first table metric (``val/accuracy`` when tabled) against alpha, one series per value
    of the next group key."""
    final_metric = keys.VAL_ACCURACY if keys.VAL_ACCURACY in table_metrics else (table_metrics or [None])[0]
    if summaries is None or final_metric is None or "alpha" not in group_keys:
        document.add("### Final metric against alpha", "", "Skipped: no table metric, or alpha is not a group key.", "")
        return
    series_key = next((k for k in group_keys if k != "alpha"), None)
    aggregates = aggregate_runs(summaries, value="final_window", group_keys=group_keys,
                                confidence=options.confidence, n_bootstrap=options.n_bootstrap,
                                random_state=options.random_state)
    reference = after_sft_reference(data.metrics, final_metric)
    document.figure(f"Final {final_metric} against alpha", f"final_vs_alpha_{_slug(final_metric)}",
                    lambda figure: plots.plot_metric_vs_alpha(
                        aggregates, final_metric, series_key=series_key, ax=figure.add_subplot(),
                        per_seed=summaries[summaries["metric"].astype(str) == final_metric],
                        reference=reference, reference_label="after SFT (step 0)"))


def _histogram_figures(document: _Document, data: SweepData, group_keys: Sequence[str]) -> None:
    """Advantage-weight heatmaps (one panel per group) and the last step's token-probability histogram."""
    histogram_names = set(data.histograms["name"].astype(str).unique()) if len(data.histograms) else set()
    if keys.HIST_WEIGHT in histogram_names:
        n_groups = len(data.histograms[list(group_keys)].drop_duplicates())
        document.figure("Advantage-weight histograms over training", "hist_weight_heatmap",
                        lambda figure: plots.plot_histogram_heatmaps(
                            data.histograms, keys.HIST_WEIGHT, group_keys=group_keys,
                            axes=figure.subplots(1, n_groups, squeeze=False, sharey=True)[0]),
                        size=(3.6 * n_groups + 1.0, 3.5))
    else:
        document.add("### Advantage-weight histograms over training", "",
                     f"Skipped: no `{keys.HIST_WEIGHT}` histograms in the run store.", "")
    if keys.HIST_TOKEN_PROB in histogram_names:
        document.figure("Token-probability histogram (last step, log count axis)", "hist_token_prob",
                        lambda figure: plots.plot_histogram(data.histograms, keys.HIST_TOKEN_PROB,
                                                            group_keys=group_keys, ax=figure.add_subplot()))
    else:
        document.add("### Token-probability histogram", "",
                     f"Skipped: no `{keys.HIST_TOKEN_PROB}` histograms in the run store.", "")


def _gradient_figures(document: _Document, data: SweepData, group_keys: Sequence[str],
                      options: ReportOptions) -> None:
    """Gradient norm by token-probability bucket, one figure per logged statistic."""
    grad_stats = plots.available_grad_stats(set(data.metric_names))
    if not grad_stats:
        document.add("### Gradient norm by token probability", "",
                     f"Skipped: no `{keys.GRAD_BY_PROB_PREFIX}/<bucket>/<stat>` metrics for the stats "
                     f"{', '.join(plots.GRAD_BUCKET_STATS)}.", "")
        return
    for stat in grad_stats:
        document.figure(f"Gradient norm by token probability ({stat})", f"grad_by_prob_{stat}",
                        lambda figure, s=stat: plots.plot_grad_by_bucket(
                            data.metrics, stat=s, group_keys=group_keys, final_window=options.final_window,
                            confidence=options.confidence, n_bootstrap=options.n_bootstrap,
                            random_state=options.random_state, ax=figure.add_subplot()))


def _prob_change_figures(document: _Document, data: SweepData, group_keys: Sequence[str],
                         options: ReportOptions) -> None:
    """How one update moved each token's probability, by advantage sign and bucket (next to the gradient shares)."""
    names = set(data.metric_names)
    stats = [stat for stat in plots.PROB_CHANGE_LABELS
             if any(plots.prob_change_metrics(names, sign, stat) for sign in keys.ADVANTAGE_SIGNS)]
    if not stats:
        return
    document.add("How one policy update moved each token's probability (the AR paper's \"why\"): after a step's "
                 "update the updated policy scores the same batch, and per advantage sign and old-probability bucket "
                 "the bars give the share of tokens whose probability moved in the direction of their advantage "
                 "(above 0.5: mostly the right way) and the mean change, time-averaged over the measured steps, mean "
                 "over seeds with the t interval.", "")
    for stat in stats:
        document.figure(f"Probability change by token probability ({stat})", f"prob_change_{stat}",
                        lambda figure, s=stat: plots.plot_prob_change(
                            data.metrics, stat=s, group_keys=group_keys, final_window=options.final_window,
                            confidence=options.confidence, n_bootstrap=options.n_bootstrap,
                            random_state=options.random_state, axes=figure.subplots(1, 2, sharey=True)),
                        size=(11.0, 4.2))


def _low_prob_share_figure(document: _Document, data: SweepData, group_keys: Sequence[str],
                           options: ReportOptions) -> None:
    """The share of low-probability tokens over training."""
    if keys.TOKEN_PROB_LOW_FRAC not in set(data.metric_names):
        document.add("### Low-probability token share over training", "",
                     f"Skipped: `{keys.TOKEN_PROB_LOW_FRAC}` is not logged.", "")
        return
    document.figure("Low-probability token share over training", "low_prob_share",
                    lambda figure: plots.plot_low_prob_share(
                        data.metrics, group_keys=group_keys, ax=figure.add_subplot(),
                        confidence=options.confidence, random_state=options.random_state,
                        smoothing=curve_smoothing(data.metrics, keys.TOKEN_PROB_LOW_FRAC)))


def _where_groups_differ_section(document: _Document, data: SweepData, table_metrics: Sequence[str],
                                 group_keys: Sequence[str], options: ReportOptions) -> None:
    """"## Where in training the groups differ": per evaluation metric of the tables, one figure per comparison with
    the baseline (:func:`analysis.curves.curve_differences`), then the primary metric's sample-efficiency curves.
    Nothing without a baseline group and another group to compare with it."""
    if not table_metrics:
        return
    runs = data.included_runs  # the groups and their values, without scanning the metrics table
    baseline = default_baseline(runs, group_keys)
    if baseline is None or len(runs[list(group_keys)].drop_duplicates()) < 2:
        return
    within = [key for key in group_keys if key not in baseline]
    measured = "" if options.confidence != 0.95 else (  # measured at the default level only
        " (simulated with correlated steps: " + ", ".join(f"{value:.1%}" for value in MEASURED_BAND_COVERAGE.values())
        + f" at {', '.join(map(str, MEASURED_BAND_COVERAGE))} seeds, see docs/analysis.md)")
    document.add(
        "## Where in training the groups differ", "",
        f"Each group against the baseline{' at the same ' + ', '.join(within) if within else ''}, paired by seed at "
        "every evaluation step both logged: the line is the mean paired difference (group minus baseline), the dark "
        f"band its {options.confidence:.0%} pointwise paired-t interval, the light band a {options.confidence:.0%} "
        f"simultaneous band over all K steps of the comparison ({BAND_METHOD}: Bonferroni over the K steps with "
        "paired-t quantiles `t_{1-a/(2K), n-1}`). The whole true difference curve lies inside the light band with "
        f"probability at least {options.confidence:.0%} whatever the correlation between steps{measured}. Where "
        "the light band excludes 0, the groups differ at that step; a dark band alone "
        "misses somewhere along a curve far more often than its level says. Comparisons with fewer than "
        f"{MIN_SEEDS_FOR_INTERVAL} paired seeds are not drawn.", "")
    evaluation_metrics = [m for m in table_metrics if curve_smoothing(data.metrics, m) is None]
    dense = [m for m in table_metrics if m not in evaluation_metrics]
    if dense:
        document.add(f"Not compared step by step (logged at least {SMOOTH_MIN_POINTS} times per run, so a "
                     f"simultaneous band over every step is too wide to show anything): {', '.join(dense)}.", "")
    duplicates = plots.identical_metrics(data.metrics, evaluation_metrics)
    for metric in (m for m in evaluation_metrics if m not in duplicates):
        _curve_difference_figures(document, data, metric, group_keys, baseline, options)
    _sample_efficiency_figure(document, data, table_metrics, group_keys, options)


def _curve_difference_figures(document: _Document, data: SweepData, metric: str, group_keys: Sequence[str],
                              baseline: Mapping[str, object], options: ReportOptions) -> None:
    """One curve-difference figure per comparison of ``metric`` with at least ``MIN_SEEDS_FOR_INTERVAL`` paired
    seeds; a line naming the others."""
    try:
        frame = curve_differences(data.metrics, metric, group_keys=group_keys, baseline=baseline,
                                  confidence=options.confidence)
    except ValueError as exc:
        document.add(f"### {plots.metric_label(metric)}: differences against the baseline", "",
                     f"_Could not compare: {exc}_", "")
        return
    colors = plots.group_color_map(data.metrics[data.metrics["metric"].astype(str) == metric], group_keys)
    too_few = []
    for group, rows in frame.groupby(list(group_keys), sort=True, dropna=False, observed=True):
        group = group if isinstance(group, tuple) else (group,)
        label = plots.group_label(group_keys, group)
        if int(rows["n"].max()) < MIN_SEEDS_FOR_INTERVAL:
            too_few.append(f"{label} ({int(rows['n'].max())})")
            continue
        color = next((c for g, c in colors.items() if group_key(g) == group_key(group)), None)
        document.figure(f"{metric}: {label} against the baseline", f"difference_{_slug(metric)}_{_slug(label)}",
                        lambda figure, r=rows, c=color: plots.plot_curve_difference(
                            r, ax=figure.add_subplot(), color=c))
    if too_few:
        document.add(f"`{metric}`, not drawn (fewer than {MIN_SEEDS_FOR_INTERVAL} seeds paired with the baseline; "
                     f"most paired seeds at a step in brackets): {', '.join(too_few)}.", "")


def _sample_efficiency_figure(document: _Document, data: SweepData, table_metrics: Sequence[str],
                              group_keys: Sequence[str], options: ReportOptions) -> None:
    """Mean and IQM curves of the primary metric with their intervals, when at least two groups have
    ``MIN_SEEDS_FOR_INTERVAL`` runs to give them."""
    metric = keys.VAL_ACCURACY if keys.VAL_ACCURACY in table_metrics else table_metrics[0]
    rows = data.metrics[data.metrics["metric"].astype(str) == metric]
    runs = rows.groupby(list(group_keys), dropna=False, observed=True)["run"].nunique()
    title = f"Sample efficiency: {metric}"
    if int((runs >= MIN_SEEDS_FOR_INTERVAL).sum()) < 2:
        document.add(f"### {title}", "", f"Skipped: fewer than two groups with {MIN_SEEDS_FOR_INTERVAL} seeds.", "")
        return
    document.add("Sample efficiency (rliable's curves): the mean over seeds at each step with its Student-t interval, "
                 "and the interquartile mean (IQM) with the Tukey-McLaughlin trimmed-mean t interval (25% trimmed, "
                 "winsorised variance, n - 2g - 1 degrees of freedom). Below 4 seeds the IQM trims nothing and equals "
                 "the mean. Measured by simulation on normal data, the IQM band covers 0.949 at 3 seeds but 0.938 at "
                 "5 and 0.941 at 10 for a nominal 0.95 (docs/analysis.md): read it as a 94% band; the mean's covers "
                 f"0.95. Bands from {MIN_SEEDS_FOR_INTERVAL} seeds on.", "")
    document.figure(title, f"sample_efficiency_{_slug(metric)}",
                    lambda figure: plots.plot_sample_efficiency(
                        data.metrics, metric, group_keys=group_keys, confidence=options.confidence,
                        axes=figure.subplots(1, 2, sharey=True)),
                    size=(11.0, 4.2))


def after_sft_reference(long: pd.DataFrame, metric: str) -> float | None:
    """Mean over runs of ``metric`` at step 0 (the evaluation of the SFT warm start before any RL step), or None."""
    at_start = long[(long["metric"].astype(str) == metric) & (long["step"] == 0)]
    return float(at_start["value"].mean()) if len(at_start) else None


def build_report(
    sweep_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
    options: ReportOptions = ReportOptions(),
) -> Path:
    """Load ``sweep_dir``, write its sweep-level ``metrics.parquet`` and ``runs.parquet`` (:mod:`analysis.export`)
    and its report into ``out_dir`` (default ``<sweep_dir>/report``); return ``report.md``."""
    check_one_sweep(sweep_dir)  # nothing is written into a folder of several sweeps (runs/ itself)
    data = load_sweep(sweep_dir, include_incomplete=options.include_incomplete, require_runs=True)
    # the sweep-level tables hold the completed runs' metrics; a single run folder keeps its own files
    if not options.include_incomplete and not (Path(sweep_dir) / "meta.json").is_file():
        write_sweep_tables(data, sweep_dir)
    return write_report(data, Path(out_dir) if out_dir is not None else Path(sweep_dir) / "report", options)


def _threshold(text: str) -> tuple[str, float]:
    metric, separator, value = text.rpartition("=")
    try:
        if not separator or not metric:
            raise ValueError
        return metric, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threshold {text!r}: expected METRIC=VALUE, e.g. val/accuracy=0.5") from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m analysis.report``."""
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="sweep folder runs/<sweep> (holding run folders and optionally sweep.json)")
    parser.add_argument("--out", help="output folder (default: <sweep_dir>/report)")
    parser.add_argument("--metric", action="append", dest="metrics", metavar="KEY",
                        help=f"a table metric (repeatable; default: those of {', '.join(DEFAULT_METRICS)} present)")
    parser.add_argument("--group-key", action="append", dest="group_keys", metavar="COLUMN",
                        help="grouping column (repeatable; default the swept non-seed factors: alpha, plus "
                             "mechanism_label, eta, trainer.lr, ... when they vary)")
    parser.add_argument("--final-window", type=int, default=DEFAULT_FINAL_WINDOW,
                        help="logged values averaged at the end of each run (default %(default)s)")
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    parser.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, help="bootstrap resamples")
    parser.add_argument("--random-state", type=int, default=0)
    parser.add_argument("--style", choices=TABLE_STYLES, default="pm", help="pm: mean ± half-width; interval: [lo, hi]")
    parser.add_argument("--threshold", action="append", type=_threshold, default=[], metavar="METRIC=VALUE",
                        help="also report steps to reach VALUE for METRIC (repeatable)")
    parser.add_argument("--target-effect", type=float, default=0.01,
                        help="difference for 'to detect E you need N seeds' (default %(default)s)")
    parser.add_argument("--include-incomplete", action="store_true",
                        help="aggregate failed / unfinished runs too (they stay listed by state)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0, or 2 when the sweep folder or a group key does not exist, or the folder
    holds several sweeps)."""
    arguments = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    options = ReportOptions(
        metrics=tuple(arguments.metrics) if arguments.metrics else None,
        group_keys=tuple(arguments.group_keys) if arguments.group_keys else None,
        final_window=arguments.final_window, confidence=arguments.confidence, n_bootstrap=arguments.bootstrap,
        random_state=arguments.random_state, style=arguments.style, thresholds=dict(arguments.threshold),
        include_incomplete=arguments.include_incomplete, target_effect=arguments.target_effect,
    )
    try:
        report_path = build_report(arguments.sweep_dir, arguments.out, options)
    except (FileNotFoundError, KeyError, SeveralSweepsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
