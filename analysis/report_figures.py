"""The report's figure sections, the :class:`Document` they write into and the :class:`ReportOptions`."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from analysis import plots
from analysis.aggregate import DEFAULT_FINAL_WINDOW, aggregate_runs, default_baseline, paired_differences
from analysis.bootstrap import DEFAULT_BOOTSTRAP
from analysis.collapse import CollapseRule
from analysis.curves import BAND_METHOD, MEASURED_BAND_COVERAGE, curve_differences
from analysis.frames import SweepData
from analysis.groups import group_key
from analysis.statistics import DEFAULT_CONFIDENCE, MIN_SEEDS_FOR_INTERVAL
from dataflex_rl import keys

logger = logging.getLogger(__name__)

CURVE_METRICS: tuple[tuple[str, str], ...] = ((keys.VAL_ACCURACY, "Validation accuracy"), (keys.SCORE_MEAN, "Reward"))
SMOOTHING = 0.9  # EMA factor of per-step curves in the report (W&B's default range); sparse curves are not smoothed
SMOOTH_MIN_POINTS = 50
WIDE = (11.0, 4.2)  # two panels side by side


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
    collapse: CollapseRule = CollapseRule()

    @property
    def statistics(self) -> dict[str, Any]:
        return {"confidence": self.confidence, "n_bootstrap": self.n_bootstrap, "random_state": self.random_state}


def primary_metric(metrics: Sequence[str]) -> str | None:
    """The metric the report's single-metric sections use: ``val/accuracy`` when present, else the first."""
    return keys.VAL_ACCURACY if keys.VAL_ACCURACY in metrics else next(iter(metrics), None)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower()


class Document:
    """Markdown lines, and figure sections whose failure leaves its error in the report instead of stopping it."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def skip(self, title: str, reason: str) -> None:
        self.add(f"### {title}", "", reason, "")

    def figure(self, title: str, name: str, draw: Callable[[Figure], Any],
               size: tuple[float, float] = (6.4, 4.2)) -> None:
        self.add(f"### {title}", "")
        figure = Figure(figsize=size, layout="constrained")
        try:
            draw(figure)
            stem = plots.save_figure(figure, self.out_dir / f"fig_{name}")[0].stem
        except Exception as exc:
            logger.warning("figure %r failed: %s", name, exc, exc_info=True)
            self.add(f"_Could not draw this figure: {type(exc).__name__}: {exc}_", "")
            return
        self.add(f"![{title}]({stem}.png)", "", f"Vector version: [{stem}.pdf]({stem}.pdf).", "")


def curve_smoothing(long: pd.DataFrame, metric: str) -> float | None:
    """:data:`SMOOTHING` for a metric logged at least :data:`SMOOTH_MIN_POINTS` times per run, else None."""
    rows = long[long["metric"].astype(str) == metric]
    points = rows.groupby(rows["run"].astype(str))["step"].size()
    return SMOOTHING if len(points) and points.median() >= SMOOTH_MIN_POINTS else None


def figure_sections(document: Document, data: SweepData, summaries: pd.DataFrame | None,
                    table_metrics: Sequence[str], group_keys: Sequence[str], options: ReportOptions,
                    collapse: pd.DataFrame | None = None) -> None:
    """Every figure section, in order; one whose data is missing says why it is skipped; ``collapse``: the collapse
    table the regime maps show beside the deltas."""
    _curve_figures(document, data, table_metrics, group_keys, options)
    _final_metric_figure(document, data, summaries, primary_metric(table_metrics), group_keys, options)
    _histogram_figures(document, data, group_keys)
    _bucket_figures(document, data, group_keys, options)
    if keys.TOKEN_PROB_LOW_FRAC in set(data.metric_names):
        document.figure("Low-probability token share over training", "low_prob_share",
                        lambda figure: plots.plot_low_prob_share(
                            data.metrics, group_keys=group_keys, ax=figure.add_subplot(), confidence=options.confidence,
                            smoothing=curve_smoothing(data.metrics, keys.TOKEN_PROB_LOW_FRAC)))
    else:
        document.skip("Low-probability token share over training",
                      f"Skipped: `{keys.TOKEN_PROB_LOW_FRAC}` is not logged.")
    _regime_maps(document, summaries, primary_metric(table_metrics), group_keys, options, collapse)


def _curve_figures(document: Document, data: SweepData, table_metrics: Sequence[str], group_keys: Sequence[str],
                   options: ReportOptions) -> None:
    """One curve figure per metric of :data:`CURVE_METRICS` and of the tables, each distinct series once."""
    available = set(data.metric_names)
    curve_metrics = list(dict.fromkeys([*(m for m, _ in CURVE_METRICS), *table_metrics]))
    titles = dict(CURVE_METRICS)
    duplicates = plots.identical_metrics(data.metrics, [m for m in curve_metrics if m in available])
    for metric in curve_metrics:
        title = titles.get(metric, plots.metric_label(metric))
        if metric not in available:
            document.skip(title, f"Skipped: `{metric}` is not logged.")
        elif metric in duplicates:
            document.skip(title, f"Not drawn: `{metric}` equals `{duplicates[metric]}` at every step of every run "
                          "(drawn once above).")
        else:
            document.figure(title, f"curve_{slug(metric)}", lambda figure, m=metric: plots.plot_curves(
                data.metrics, m, group_keys=group_keys, ax=figure.add_subplot(), confidence=options.confidence,
                smoothing=curve_smoothing(data.metrics, m)))


def _final_metric_figure(document: Document, data: SweepData, summaries: pd.DataFrame | None, metric: str | None,
                         group_keys: Sequence[str], options: ReportOptions) -> None:
    """The primary table metric's final value against alpha, one series per value of the next group key."""
    if summaries is None or metric is None or "alpha" not in group_keys:
        document.skip("Final metric against alpha", "Skipped: no table metric, or alpha is not a group key.")
        return
    aggregates = aggregate_runs(summaries, value="final_window", group_keys=group_keys, **options.statistics)
    at_start = data.metrics[(data.metrics["metric"].astype(str) == metric) & (data.metrics["step"] == 0)]
    document.figure(f"Final {metric} against alpha", f"final_vs_alpha_{slug(metric)}",
                    lambda figure: plots.plot_metric_vs_alpha(
                        aggregates, metric, series_key=next((k for k in group_keys if k != "alpha"), None),
                        ax=figure.add_subplot(), per_seed=summaries[summaries["metric"].astype(str) == metric],
                        # after SFT, before any RL step
                        reference=float(at_start["value"].mean()) if len(at_start) else None,
                        reference_label="after SFT (step 0)"))


def _histogram_figures(document: Document, data: SweepData, group_keys: Sequence[str]) -> None:
    histogram_names = set(data.histograms["name"].astype(str).unique()) if len(data.histograms) else set()
    if keys.HIST_WEIGHT in histogram_names:
        n_groups = len(data.histograms[list(group_keys)].drop_duplicates())
        document.figure("Advantage-weight histograms over training", "hist_weight_heatmap",
                        lambda figure: plots.plot_histogram_heatmaps(
                            data.histograms, keys.HIST_WEIGHT, group_keys=group_keys,
                            axes=figure.subplots(1, n_groups, squeeze=False, sharey=True)[0]),
                        size=(3.6 * n_groups + 1.0, 3.5))
    else:
        document.skip("Advantage-weight histograms over training",
                      f"Skipped: no `{keys.HIST_WEIGHT}` histograms in the run store.")
    if keys.HIST_TOKEN_PROB in histogram_names:
        document.figure("Token-probability histogram (last step, log count axis)", "hist_token_prob",
                        lambda figure: plots.plot_histogram(data.histograms, keys.HIST_TOKEN_PROB,
                                                            group_keys=group_keys, ax=figure.add_subplot()))
    else:
        document.skip("Token-probability histogram",
                      f"Skipped: no `{keys.HIST_TOKEN_PROB}` histograms in the run store.")


def _bucket_figures(document: Document, data: SweepData, group_keys: Sequence[str], options: ReportOptions) -> None:
    """The gradient norm by probability bucket, and how one update moved each bucket's probabilities."""
    names = set(data.metric_names)
    bars = {"group_keys": group_keys, "final_window": options.final_window, **options.statistics}
    grad_stats = plots.available_grad_stats(names)
    if not grad_stats:
        document.skip("Gradient norm by token probability", f"Skipped: no `{keys.GRAD_BY_PROB_PREFIX}/<bucket>/<stat>` "
                      f"metrics for the stats {', '.join(plots.GRAD_BUCKET_STATS)}.")
    for stat in grad_stats:
        document.figure(f"Gradient norm by token probability ({stat})", f"grad_by_prob_{stat}",
                        lambda figure, s=stat: plots.plot_grad_by_bucket(
                            data.metrics, stat=s, ax=figure.add_subplot(), **bars))
    stats = [stat for stat in plots.PROB_CHANGE_LABELS
             if any(plots.prob_change_metrics(names, sign, stat) for sign in keys.ADVANTAGE_SIGNS)]
    if stats:
        document.add("How one policy update moved each token's probability (the AR paper's \"why\"): after a step's "
                     "update the updated policy scores the same batch, and per advantage sign and old-probability "
                     "bucket the bars give the share of tokens whose probability moved in the direction of their "
                     "advantage (above 0.5: mostly the right way) and the mean change, time-averaged over the measured "
                     "steps, mean over seeds with the t interval.", "")
    for stat in stats:
        document.figure(f"Probability change by token probability ({stat})", f"prob_change_{stat}",
                        lambda figure, s=stat: plots.plot_prob_change(
                            data.metrics, stat=s, axes=figure.subplots(1, 2, sharey=True), **bars), size=WIDE)


def _regime_maps(document: Document, summaries: pd.DataFrame | None, metric: str | None, group_keys: Sequence[str],
                 options: ReportOptions, collapse: pd.DataFrame | None) -> None:
    """A sweep of alpha crossed with two other factors: per alpha, the primary metric's final-window delta against
    alpha 0 at the same two factors, as a regime map (drawn only for such a sweep)."""
    factors = [key for key in group_keys if key != "alpha"]
    baseline = None if summaries is None else default_baseline(summaries, group_keys)
    if summaries is None or metric is None or len(factors) != 2 or baseline is None or set(baseline) != {"alpha"}:
        return
    deltas = paired_differences(summaries, group_keys=group_keys, baseline=baseline, **options.statistics)
    for alpha in sorted(set(deltas["alpha"]) - {baseline["alpha"]}):
        document.figure(f"Regime map of {metric} at alpha = {alpha:g}", f"regime_{slug(metric)}_a{alpha:g}",
                        lambda figure, a=alpha: plots.plot_regime_map(
                            deltas, *factors, metric=metric, where={"alpha": a}, collapse=collapse,
                            ax=figure.add_subplot()), size=(8.0, 5.0))


def where_groups_differ_section(document: Document, data: SweepData, table_metrics: Sequence[str],
                                group_keys: Sequence[str], options: ReportOptions) -> None:
    """Per evaluation metric, one curve-difference figure per comparison, then the sample-efficiency curves."""
    runs = data.included_runs  # the groups and their values, without scanning the metrics table
    baseline = default_baseline(runs, group_keys) if table_metrics else None
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
    _sample_efficiency_figure(document, data, primary_metric(table_metrics), group_keys, options)


def _curve_difference_figures(document: Document, data: SweepData, metric: str, group_keys: Sequence[str],
                              baseline: Mapping[str, object], options: ReportOptions) -> None:
    """One figure per comparison with ``MIN_SEEDS_FOR_INTERVAL`` paired seeds; a line naming the others."""
    try:
        frame = curve_differences(data.metrics, metric, group_keys=group_keys, baseline=baseline,
                                  confidence=options.confidence)
    except ValueError as exc:
        document.skip(f"{plots.metric_label(metric)}: differences against the baseline", f"_Could not compare: {exc}_")
        return
    colors = {group_key(group): color for group, color in plots.group_color_map(
        data.metrics[data.metrics["metric"].astype(str) == metric], group_keys).items()}
    too_few = []
    for group, rows in frame.groupby(list(group_keys), sort=True, dropna=False, observed=True):
        label = plots.group_label(group_keys, group)
        if int(rows["n"].max()) < MIN_SEEDS_FOR_INTERVAL:
            too_few.append(f"{label} ({int(rows['n'].max())})")
            continue
        document.figure(f"{metric}: {label} against the baseline", f"difference_{slug(metric)}_{slug(label)}",
                        lambda figure, r=rows, c=colors.get(group_key(group)): plots.plot_curve_difference(
                            r, ax=figure.add_subplot(), color=c))
    if too_few:
        document.add(f"`{metric}`, not drawn (fewer than {MIN_SEEDS_FOR_INTERVAL} seeds paired with the baseline; "
                     f"most paired seeds at a step in brackets): {', '.join(too_few)}.", "")


def _sample_efficiency_figure(document: Document, data: SweepData, metric: str, group_keys: Sequence[str],
                              options: ReportOptions) -> None:
    """Mean and IQM curves of the primary metric, when two groups have ``MIN_SEEDS_FOR_INTERVAL`` runs."""
    rows = data.metrics[data.metrics["metric"].astype(str) == metric]
    runs = rows.groupby(list(group_keys), dropna=False, observed=True)["run"].nunique()
    title = f"Sample efficiency: {metric}"
    if int((runs >= MIN_SEEDS_FOR_INTERVAL).sum()) < 2:
        document.skip(title, f"Skipped: fewer than two groups with {MIN_SEEDS_FOR_INTERVAL} seeds.")
        return
    document.add("Sample efficiency (rliable's curves): the mean over seeds at each step with its Student-t interval, "
                 "and the interquartile mean (IQM) with the Tukey-McLaughlin trimmed-mean t interval (25% trimmed, "
                 "winsorised variance, n - 2g - 1 degrees of freedom). Below 4 seeds the IQM trims nothing and equals "
                 "the mean. Measured by simulation on normal data, the IQM band covers 0.949 at 3 seeds but 0.938 at "
                 "5 and 0.941 at 10 for a nominal 0.95 (docs/analysis.md): read it as a 94% band; the mean's covers "
                 f"0.95. Bands from {MIN_SEEDS_FOR_INTERVAL} seeds on.", "")
    document.figure(title, f"sample_efficiency_{slug(metric)}", lambda figure: plots.plot_sample_efficiency(
        data.metrics, metric, group_keys=group_keys, confidence=options.confidence,
        axes=figure.subplots(1, 2, sharey=True)), size=WIDE)
