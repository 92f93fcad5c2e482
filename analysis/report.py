"""Sweep report: ``python -m analysis.report runs/<sweep> [--out DIR] [--metric KEY ...]``.

Writes report.md/.html, tables and figures into ``runs/<sweep>/report/``; sections: docs/analysis.md ("The report").
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import fnmatch
import html
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from markdown_it import MarkdownIt

from analysis import plots
from analysis.aggregate import (DEFAULT_FINAL_WINDOW, aggregate_runs, default_baseline, default_group_keys,
                                lower_is_better, paired_differences, run_summaries)
from analysis.bootstrap import DEFAULT_BOOTSTRAP, MIN_BOOTSTRAP_N
from analysis.collapse import CollapseRule, collapse_outcomes, collapse_table, survival_curves
from analysis.environment import ENVIRONMENT_NOTE, environment_table, mixed_environment_warning
from analysis.export import write_sweep_tables
from analysis.frames import IDENTITY_COLUMNS, SweepData
from analysis.groups import group_text
from analysis.load import ArmValueError, SeveralSweepsError, add_run_columns, check_one_sweep, load_sweep
from analysis.power import plan_section, power_section, variance_section
from analysis.report_figures import (Document, ReportOptions, figure_sections, primary_metric,
                                     where_groups_differ_section)
from analysis.statistics import DEFAULT_CONFIDENCE, DEFAULT_LEVEL, DEFAULT_POWER, MIN_SEEDS_FOR_INTERVAL
from analysis.tables import TABLE_STYLES, ComparisonTable, comparison_table, frame_markdown, to_markdown, write_table
from analysis.warm_starts import design_sentence, warm_start_table
from dataflex_rl import keys

logger = logging.getLogger(__name__)

DEFAULT_METRICS: tuple[str, ...] = (keys.VAL_ACCURACY, keys.SCORE_MEAN, keys.TRAIN_ACCURACY, keys.RESPONSE_LENGTH_MEAN)
TABLE_VALUES: tuple[tuple[str, str], ...] = (
    ("final_window", "Final-window mean"), ("auc", "Area under the curve (time-averaged value)"))
# Files a report folder holds (what write_report writes); only a folder of these is replaced whole.
REPORT_FILES = ("report.md", "report.html", "runs.csv", "table_*", "fig_*")
PAGE_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1.5em; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 14px; display: block; overflow-x: auto; }
/* !important: the Markdown renderer writes each column's alignment inline; numbers read best right-aligned */
th { border-bottom: 2px solid #333; padding: 4px 10px; vertical-align: bottom; text-align: right !important; }
td { padding: 3px 10px; white-space: nowrap; font-variant-numeric: tabular-nums; border-bottom: 1px solid #e2e2e2;
     text-align: right !important; }
tr:last-child td { border-bottom: 2px solid #333; }
img { max-width: min(100%, 760px); height: auto; display: block; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
"""


def summary_table(data: SweepData, options: ReportOptions = ReportOptions(),
                  metric: str = keys.VAL_ACCURACY) -> ComparisonTable | None:
    """Per group: ``metric`` after SFT (step 0), its final-window mean with the paired delta, and each run's gain
    over its own step 0 (what RL added, its interval over the runs); None when not logged."""
    if metric not in set(data.metric_names):
        return None
    group_keys = tuple(options.group_keys or default_group_keys(data.included_runs))
    metrics = with_group_columns(data, group_keys).metrics
    after_title = f"{metric} after SFT (step 0)"
    final_title = f"{metric} final (mean of the last {options.final_window})"
    gain_title = f"{metric} gain over SFT (final - step 0)"
    final = run_summaries(metrics, metrics=[metric], final_window=options.final_window)
    # the step-0 value as a one-point summary of its own, so both columns go through the same aggregation
    at_start = metrics[(metrics["metric"].astype(str) == metric).to_numpy() & (metrics["step"] == 0).to_numpy()]
    after_sft = run_summaries(at_start, final_window=1) if len(at_start) else final.iloc[:0]
    start_of = after_sft.set_index("run")["final_window"]
    gain = final[final["run"].isin(start_of.index)]
    gain = gain.assign(final_window=gain["final_window"] - gain["run"].map(start_of).to_numpy())
    summaries = pd.concat([after_sft.assign(metric=after_title), final.assign(metric=final_title),
                           gain.assign(metric=gain_title)], ignore_index=True)
    baseline = default_baseline(final, group_keys)
    # the renamed column keeps the metric's direction (which delta is an improvement)
    minimize = [final_title] if lower_is_better(metric) else []
    deltas = None if baseline is None else paired_differences(
        summaries[summaries["metric"] == final_title], group_keys=group_keys, baseline=baseline, minimize=minimize,
        **options.statistics)
    aggregates = aggregate_runs(summaries, group_keys=group_keys, **options.statistics)
    present = [title for title in (after_title, final_title, gain_title) if title in set(aggregates["metric"])]
    return comparison_table(aggregates, deltas=deltas, metrics=present, group_keys=group_keys, style=options.style,
                            caption=f"{metric} after SFT and at the end of training, per group")


def write_report(data: SweepData, out_dir: str | os.PathLike[str], options: ReportOptions = ReportOptions()) -> Path:
    """Write the report into ``out_dir`` (swapped in whole when complete, one writer at a time); return report.md."""
    import filelock

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(out_dir.parent / f".{out_dir.name}.lock", thread_local=False):
        # a folder holding other files than a report's is written in place
        if out_dir.is_dir() and not all(entry.is_file() and any(fnmatch.fnmatch(entry.name, pattern)
                                                                for pattern in REPORT_FILES)
                                        for entry in out_dir.iterdir()):
            return _write_report_files(data, out_dir, options)
        for stale in out_dir.parent.glob(f".{out_dir.name}.*.partial"):  # left by a report that was killed
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
        try:
            _write_report_files(data, staging, options)
            mask = os.umask(0)
            os.umask(mask)
            staging.chmod(0o777 & ~mask)
            previous = out_dir.parent / f".{out_dir.name}.{staging.name.split('.')[-2]}.old.partial"
            if out_dir.exists():
                os.replace(out_dir, previous)
            os.replace(staging, out_dir)
            shutil.rmtree(previous, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out_dir / "report.md"


def _write_report_files(data: SweepData, out_dir: Path, options: ReportOptions) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    document = Document(out_dir)
    group_keys = tuple(options.group_keys or default_group_keys(data.included_runs))
    data = with_group_columns(data, group_keys)
    _header_section(document, data, group_keys, options)
    _warning_section(document, data)
    data.runs.to_csv(out_dir / "runs.csv", index=False)
    _runs_sections(document, data, group_keys, options)
    environments = environment_table(data.runs)
    document.add("## Environment", "", frame_markdown(environments) if len(environments) else "No included runs.",
                 "", ENVIRONMENT_NOTE, "")
    available = set(data.metric_names)
    requested = list(options.metrics) if options.metrics else [m for m in DEFAULT_METRICS if m in available]
    if missing := [m for m in requested if m not in available]:
        document.add(f"Metrics not logged by any included run (left out): {', '.join(missing)}.", "")
    table_metrics = [m for m in requested if m in available]
    summaries = None
    if table_metrics:
        summaries = run_summaries(data.metrics, metrics=table_metrics, final_window=options.final_window,
                                  thresholds=dict(options.thresholds))
        _table_sections(document, data, summaries, table_metrics, group_keys, options)
        # what each comparison of the primary metric can detect, its variance split and the sweep's seed plan
        primary = primary_metric(table_metrics)
        plan = (data.manifest or {}).get("plan")
        target = float(plan["target_mde"]) if plan and plan.get("target_mde") else options.target_effect
        power_section(document.add, summaries, primary, group_keys, target, options.confidence)
        variance_section(document.add, summaries, data.runs, primary, group_keys)
        if plan:
            plan_section(document.add, plan, summaries, group_keys, options.confidence)
    else:
        document.add("## Tables", "", "Skipped: none of the table metrics is present.", "")
    collapse = collapse_section(document, data, group_keys, options)
    document.add("## Figures", "")
    figure_sections(document, data, summaries, table_metrics, group_keys, options, collapse)
    where_groups_differ_section(document, data, table_metrics, group_keys, options)
    text = "\n".join(document.lines).rstrip() + "\n"
    (out_dir / "report.md").write_text(text, encoding="utf-8")
    (out_dir / "report.html").write_text(render_report_html(text, text.splitlines()[0].lstrip("# ")),
                                         encoding="utf-8")
    return out_dir / "report.md"


def render_report_html(markdown_text: str, title: str) -> str:
    """The report as one HTML page, numbers unwrapped and right-aligned; raw HTML in the Markdown is escaped."""
    # commonmark plus tables and strikethrough (gfm-like would also need linkify-it-py)
    body = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).render(markdown_text)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{PAGE_STYLE}</style>\n</head>\n<body>\n{body}</body>\n"
            "</html>\n")


def collapse_section(document: Document, data: SweepData, group_keys: Sequence[str],
                     options: ReportOptions) -> pd.DataFrame | None:
    """When any included run collapsed: :func:`collapse_lines` and the survival curves; returns the table (None when
    no run collapsed or the rule's metric is not logged)."""
    found = collapse_lines(data, group_keys, options.collapse, options.confidence)
    if found is None:
        return None
    table, outcomes, lines = found
    document.add("## Collapse", "", *lines)
    curves = survival_curves(outcomes, group_keys, options.confidence)
    document.figure("Time to collapse", "collapse_survival",
                    lambda figure: plots.plot_survival(curves, ax=figure.add_subplot()), size=(7.0, 4.5))
    return table


def collapse_lines(data: SweepData, group_keys: Sequence[str], rule: CollapseRule, confidence: float
                   ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]] | None:
    """When any included run collapsed (:class:`analysis.collapse.CollapseRule`): per group the rate with its exact
    interval and each arm's exact McNemar test against the baseline of its cell, as (table, outcomes, Markdown
    lines) for the report and the results files; None when no run collapsed or the rule's metric is not logged."""
    if rule.metric not in set(data.metric_names):
        return None
    outcomes = collapse_outcomes(data.metrics, rule, group_keys)
    if not outcomes["collapsed"].any():
        return None
    table = collapse_table(outcomes, group_keys, default_baseline(outcomes, group_keys), confidence)
    shown = table.assign(rate=[f"{r:.2f} [{lo:.2f}, {hi:.2f}]" for r, lo, hi in
                               zip(table["rate"], table["rate_low"], table["rate_high"], strict=True)])
    shown = shown.drop(columns=["rate_low", "rate_high"])
    if "p_mcnemar" in shown.columns:
        shown["p_mcnemar"] = [f"{p:.3f}" if pd.notna(p) else "baseline" for p in shown["p_mcnemar"]]
        for column in ("pairs", "arm_only", "baseline_only"):
            shown[column] = [f"{int(v)}" if pd.notna(v) else "" for v in shown[column]]
    lines = [f"Rule: {rule.describe()}. Rate: collapsed runs out of the judged ones, [{confidence:.0%} "
             "Clopper-Pearson interval]; against the baseline at the same other factors, the pairs of runs of one "
             "seed where only the arm collapsed and where only the baseline did, and the exact McNemar p-value (a "
             "binomial test of those discordant pairs).", "", frame_markdown(shown), ""]
    unjudged = outcomes[~outcomes["judged"]]
    if len(unjudged):
        lines += [f"Not judged (no step-0 value of `{rule.metric}`): {', '.join(map(str, unjudged['run']))}.", ""]
    return table, outcomes, lines


def with_group_columns(data: SweepData, group_keys: Sequence[str]) -> SweepData:
    """``data`` with group keys found only in the run table (``config.<key>``) copied onto metrics and histograms."""
    unknown = [k for k in group_keys if k not in data.runs.columns]
    if unknown:
        raise KeyError(f"group keys {unknown} are not run-table columns; use identity columns such as alpha, "
                       f"mechanism_label, backend, or config.<key> columns")
    extra_keys = [k for k in group_keys if k not in IDENTITY_COLUMNS]
    if not extra_keys:
        return data
    return dataclasses.replace(data, metrics=add_run_columns(data.metrics, data.runs, extra_keys), histograms=(
        add_run_columns(data.histograms, data.runs, extra_keys) if len(data.histograms) else data.histograms))


def _header_section(document: Document, data: SweepData, group_keys: Sequence[str], options: ReportOptions) -> None:
    sweep_names = sorted(data.runs["sweep"].astype(str).unique()) if len(data.runs) else ["(empty)"]
    n_included = int(data.runs["included"].sum())
    document.add(
        f"# Sweep report: {', '.join(sweep_names)}", "",
        f"Source: `{data.source}`. Generated {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}.", "",
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


def _warning_section(document: Document, data: SweepData) -> None:
    lines = []
    metrics = data.metrics
    lengths = metrics.groupby(metrics["run"].astype(str), observed=True)["step"].max()
    if lengths.nunique() > 1:
        listed = "; ".join(f"{step} steps: {', '.join(runs[:4])}{' ...' if len(runs) > 4 else ''}"
                           for step, runs in sorted(lengths.index.groupby(lengths.to_numpy()).items()))
        lines.append(f"- **Runs of different lengths are compared**: {listed}. Final windows and AUCs of runs "
                     "that end at different steps are not comparable; rerun the short ones to the same length "
                     "(a larger `steps` resumes them).")
    for metric in DEFAULT_METRICS:
        # included runs that logged no finite value of a metric others logged drop out of its n
        logged = set(metrics.loc[metrics["metric"].astype(str) == metric, "run"].astype(str))
        missing = [str(run) for run in data.included_runs["run"] if logged and str(run) not in logged]
        if missing:
            lines.append(f"- {len(missing)} included run(s) logged no finite `{metric}`, so they are left out of its "
                         f"n: {', '.join(missing)}.")
    for run, text in data.included_runs.dropna(subset=["nonfinite"])[["run", "nonfinite"]].itertuples(index=False):
        lines.append(f"- Run {run} logged NaN or infinite values of {text}: each such metric is left out of its n "
                     "for this run (no final value is taken from its earlier values).")
    environments = mixed_environment_warning(data.runs)
    if environments:
        lines.append(f"- {environments}")
    if lines:
        document.add("## Warnings", "", *lines, "")


def _runs_sections(document: Document, data: SweepData, group_keys: Sequence[str], options: ReportOptions) -> None:
    headline = summary_table(data, options)
    if headline is not None:
        document.add("## Summary", "", to_markdown(headline), "", design_sentence(data), "",
                     "The sweep driver prints this same table and sentence at the end of a sweep.", "")
    warm_starts = warm_start_table(data)
    if not warm_starts.empty:
        document.add("## Warm starts", "", "Each warm start the included runs started from, with its evaluation "
                     "after SFT (step 0, before any RL step):", "", frame_markdown(warm_starts, ".3f"), "")
    document.add("## Runs", "")
    if data.included_runs.empty:
        document.add("No completed runs.", "")
    else:
        overview = data.included_runs.groupby(list(group_keys), dropna=False, sort=True, observed=True).agg(
            runs=("run", "count"), seeds=("seed", lambda s: ", ".join(str(v) for v in sorted(s.dropna()))))
        document.add(frame_markdown(overview.reset_index()), "")
    document.add("## Excluded runs", "")
    excluded = data.excluded_runs[["run", "alpha", "seed", "state", "exclusion_reason"]].rename(
        columns={"exclusion_reason": "reason"}).reset_index(drop=True)
    if excluded.empty:
        document.add("None: every run completed.", "")
    else:
        document.add(f"{len(excluded)} run(s) left out of every aggregate:", "", frame_markdown(excluded), "")


def _table_sections(document: Document, data: SweepData, summaries: pd.DataFrame, metrics: Sequence[str],
                    group_keys: Sequence[str], options: ReportOptions) -> None:
    baseline = default_baseline(summaries, group_keys)
    statistics = {"group_keys": group_keys, **options.statistics}
    # one metric, one column: a metric equal to an earlier one at every step (train/accuracy on a 0/1 reward) is
    # shown once, as the figures draw it once
    repeated = plots.identical_metrics(data.metrics, metrics)
    metrics = [metric for metric in metrics if metric not in repeated]
    once = "; ".join(f"`{metric}` equals `{same}` at every step of every run" for metric, same in repeated.items())
    for value, title in TABLE_VALUES:
        document.add(f"## {title}", "")
        aggregates = aggregate_runs(summaries, value=value, **statistics)
        deltas = None
        if baseline is None:
            document.add("No deltas: no single baseline group (alpha = 0 or mechanism label `baseline`).", "")
        else:
            deltas = paired_differences(summaries, value=value, baseline=baseline, **statistics)
            within = [key for key in group_keys if key not in baseline]
            document.add(f"Baseline: {group_text(baseline)}" + (f", at the same {', '.join(within)}" if within else "")
                         + ".", "")
        table = comparison_table(aggregates, deltas=deltas, metrics=metrics, group_keys=group_keys,
                                 style=options.style, caption=f"{title} per group")
        files = write_table(table, document.out_dir, f"table_{value}")
        document.add(to_markdown(table), "",
                     "Files: " + ", ".join(f"[{fmt}]({path.name})" for fmt, path in files.items()), "")
        if once:
            document.add(f"Shown once: {once} (its column would repeat that one's).", "")
    if options.thresholds:
        document.add("## Steps to threshold", "")
        reached = aggregate_runs(summaries[summaries["metric"].isin(list(options.thresholds))],
                                 value="steps_to_threshold", **statistics)
        document.add("First step at which a run reached the threshold; n counts the runs that reached it.", "",
                     to_markdown(comparison_table(reached, group_keys=group_keys, style=options.style, digits=1)),
                     "")


def build_report(sweep_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
                 options: ReportOptions = ReportOptions()) -> Path:
    """Load ``sweep_dir``, write its sweep-level parquet tables and its report (default ``<sweep_dir>/report``)."""
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("sweep_dir", help="sweep folder runs/<sweep> (holding run folders and optionally sweep.json)")
    add("--out", help="output folder (default: <sweep_dir>/report)")
    add("--metric", action="append", dest="metrics", metavar="KEY",
        help=f"a table metric (repeatable; default: those of {', '.join(DEFAULT_METRICS)} present)")
    add("--group-key", action="append", dest="group_keys", metavar="COLUMN",
        help="grouping column (repeatable; default the swept non-seed factors: alpha, plus mechanism_label, eta, "
             "trainer.lr, ... when they vary)")
    add("--final-window", type=int, default=DEFAULT_FINAL_WINDOW,
        help="logged values averaged at the end of each run (default %(default)s)")
    add("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    add("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, dest="n_bootstrap", help="bootstrap resamples")
    add("--random-state", type=int, default=0)
    add("--style", choices=TABLE_STYLES, default="pm", help="pm: mean ± half-width; interval: [lo, hi]")
    add("--threshold", action="append", type=_threshold, default=[], dest="thresholds", metavar="METRIC=VALUE",
        help="also report steps to reach VALUE for METRIC (repeatable)")
    add("--target-effect", type=float, default=ReportOptions.target_effect,
        help="difference for 'to detect E you need N seeds' (default %(default)s)")
    add("--collapse-margin", type=float, default=CollapseRule.margin,
        help="a run collapsed when its metric fell this far below its step-0 value and stayed there "
             "(default %(default)s)")
    add("--collapse-evaluations", type=int, default=CollapseRule.min_evaluations,
        help="... over at least this many evaluations (default %(default)s)")
    add("--include-incomplete", action="store_true",
        help="aggregate failed / unfinished runs too (they stay listed by state)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status 0, or 2 for a missing sweep folder or group key, or a folder of several sweeps."""
    parser = _parser()
    arguments = vars(parser.parse_args(argv))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sweep_dir, out = arguments.pop("sweep_dir"), arguments.pop("out")
    try:
        collapse = CollapseRule(margin=arguments.pop("collapse_margin"),
                                min_evaluations=arguments.pop("collapse_evaluations"))
    except ValueError as error:
        parser.error(str(error))
    options = ReportOptions(**{**arguments, "metrics": tuple(arguments["metrics"] or ()) or None,
                               "group_keys": tuple(arguments["group_keys"] or ()) or None,
                               "thresholds": dict(arguments["thresholds"]), "collapse": collapse})
    try:
        report_path = build_report(sweep_dir, out, options)
    except (FileNotFoundError, KeyError, SeveralSweepsError, ArmValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
