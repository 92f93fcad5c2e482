"""Bar figures by probability bucket: gradient shares and the probability change of one update, by advantage sign."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from analysis.aggregate import DEFAULT_FINAL_WINDOW, aggregate_runs, run_summaries
from analysis.plots.style import axes_or_new, group_colors, group_label, group_rows, sorted_groups
from analysis.statistics import DEFAULT_CONFIDENCE, RandomState
from dataflex_rl import keys

GRAD_BUCKET_PATTERN = re.compile(
    rf"^{re.escape(keys.GRAD_BY_PROB_PREFIX)}/(?P<low>-?[0-9.]+)-(?P<high>-?[0-9.]+)/(?P<stat>[A-Za-z_]+)$")
# Per-bucket statistics drawn as bars (``keys.grad_by_prob``): the closed-form and exact gradient-norm shares (local
# backend) and the logit-gradient bound ``mean |A w| (1 - pi)`` (both backends).
GRAD_BUCKET_STATS: tuple[str, ...] = ("logit_grad_norm_share", "param_grad_share", "logit_grad_bound")
GRAD_STAT_LABELS: dict[str, str] = {
    "logit_grad_norm_share": "Share of the logit-gradient norm",
    "param_grad_share": "Share of the parameter-gradient norm",
    "logit_grad_bound": "Logit-gradient bound mean |A w| (1 - \u03c0)",
}
PROB_CHANGE_PATTERN = re.compile(
    rf"^{re.escape(keys.PROB_CHANGE_PREFIX)}/(?P<sign>pos|neg)/(?P<low>[0-9.]+)-(?P<high>[0-9.]+)/(?P<stat>[A-Za-z_]+)$")
PROB_CHANGE_LABELS: dict[str, str] = {
    "correct_share": "Share of tokens whose \u03c0 moved with their advantage",
    "mean_delta": "Mean change of \u03c0 in one update",
}
ADVANTAGE_SIGN_LABELS = {"pos": "positive advantage (\u03c0 should rise)", "neg": "negative advantage (\u03c0 should fall)"}


def grad_bucket_metrics(metric_names: Collection[str], stat: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every ``grad_norm/by_prob/<low>-<high>/<stat>`` key."""
    return _bucket_metrics(GRAD_BUCKET_PATTERN, metric_names, stat=stat)


def _bucket_metrics(pattern: re.Pattern[str], metric_names: Collection[str],
                    **wanted: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every name ``pattern`` matches with the ``wanted`` groups, sorted by ``low``."""
    matches = [(str(name), pattern.match(str(name))) for name in metric_names]
    found = [(name, float(match["low"]), float(match["high"])) for name, match in matches
             if match and all(match[group] == value for group, value in wanted.items())]
    return sorted(found, key=lambda item: item[1])


def plot_grad_by_bucket(long: pd.DataFrame, *, stat: str = "logit_grad_norm_share", value: str = "auc",
                        group_keys: Sequence[str] = ("alpha",), final_window: int = DEFAULT_FINAL_WINDOW,
                        confidence: float = DEFAULT_CONFIDENCE, n_bootstrap: int = 2000, random_state: RandomState = 0,
                        ax: Axes | None = None) -> Axes:
    """Bars of ``grad_norm/by_prob/<bucket>/<stat>`` per bucket and group with intervals (the paper's Fig. 1d)."""
    buckets = grad_bucket_metrics(long["metric"].unique(), stat)
    if not buckets:
        raise KeyError(f"no '{keys.GRAD_BY_PROB_PREFIX}/<low>-<high>/{stat}' metric in the table")
    ax = axes_or_new(ax)
    _bucket_bars(ax, long, buckets, final_window=final_window, value=value, group_keys=group_keys,
                 confidence=confidence, n_bootstrap=n_bootstrap, random_state=random_state)
    ax.set_ylabel(GRAD_STAT_LABELS.get(stat, stat))
    ax.set_title(f"{GRAD_STAT_LABELS.get(stat, stat)} by token probability\n"
                 f"{_summary_text(value, final_window, confidence)}", fontsize="medium")
    return ax


def _summary_text(value: str, final_window: int, confidence: float) -> str:
    summary = {"auc": "time-averaged over training", "final_window": f"mean of the last {final_window} steps"}
    return f"({summary.get(value, value)}, mean over seeds, {confidence:.0%} CI)"


def _bucket_bars(ax: Axes, long: pd.DataFrame, buckets: Sequence[tuple[str, float, float]], *, final_window: int,
                 group_keys: Sequence[str], **aggregate_options: object) -> None:
    """One bar per bucket and group: the mean over seeds of the per-run ``value``, with its interval."""
    summaries = run_summaries(long, metrics=[b[0] for b in buckets], final_window=final_window)
    aggregates = aggregate_runs(summaries, group_keys=group_keys, **aggregate_options)
    groups = sorted_groups(aggregates, group_keys)
    colors = group_colors(groups)
    width = 0.8 / len(groups)
    positions = np.arange(len(buckets), dtype=np.float64)
    for index, group in enumerate(groups):
        part = group_rows(aggregates, group_keys, group)
        by_metric = part.assign(metric=part["metric"].astype(str)).drop_duplicates("metric", keep="last")
        center, low, high = by_metric.set_index("metric").reindex([b[0] for b in buckets])[
            ["mean", "ci_low", "ci_high"]].to_numpy(dtype=np.float64).T
        ax.bar(positions + (index - (len(groups) - 1) / 2) * width, center, width=width, color=colors[group],
               yerr=np.clip(np.nan_to_num(np.vstack([center - low, high - center])), 0.0, None), capsize=2,
               label=group_label(group_keys, group))
    ax.set_xticks(positions, [f"[{b[1]:.2f}, {b[2]:.2f})" for b in buckets])
    ax.set_xlabel("token probability \u03c0 bucket (before the update)")
    ax.grid(axis="y", alpha=0.3, linewidth=0.5)
    ax.legend(fontsize="small")


def prob_change_metrics(metric_names: Collection[str], sign: str, stat: str) -> list[tuple[str, float, float]]:
    """``(metric, low, high)`` of every ``prob_change/<sign>/<low>-<high>/<stat>`` key."""
    return _bucket_metrics(PROB_CHANGE_PATTERN, metric_names, sign=sign, stat=stat)


def plot_prob_change(long: pd.DataFrame, *, stat: str = "correct_share", value: str = "auc",
                     group_keys: Sequence[str] = ("alpha",), final_window: int = DEFAULT_FINAL_WINDOW,
                     confidence: float = DEFAULT_CONFIDENCE, n_bootstrap: int = 2000, random_state: RandomState = 0,
                     axes: Sequence[Axes] | None = None) -> np.ndarray:
    """How one update moved token probabilities (the AR paper's Fig. 2): bars of ``prob_change/<sign>/<bucket>/<stat>``
    per group, positive advantages left, negative right; returns the two axes."""
    names = long["metric"].unique()
    buckets = {sign: prob_change_metrics(names, sign, stat) for sign in keys.ADVANTAGE_SIGNS}
    if not any(buckets.values()):
        raise KeyError(f"no '{keys.PROB_CHANGE_PREFIX}/<sign>/<low>-<high>/{stat}' metric in the table")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11.0, 4.2), sharey=True)
    for ax, sign in zip(axes, keys.ADVANTAGE_SIGNS, strict=True):
        if buckets[sign]:
            _bucket_bars(ax, long, buckets[sign], value=value, group_keys=group_keys, final_window=final_window,
                         confidence=confidence, n_bootstrap=n_bootstrap, random_state=random_state)
        # the reference: half the tokens moving each way (correct_share), or no change (mean_delta)
        ax.axhline(0.5 if stat == "correct_share" else 0.0, color="0.4", linewidth=0.8, linestyle="--")
        ax.set_title(f"{ADVANTAGE_SIGN_LABELS[sign]}\n{_summary_text(value, final_window, confidence)}",
                     fontsize="medium")
    axes[0].set_ylabel(PROB_CHANGE_LABELS.get(stat, stat))
    return np.asarray(axes)


def available_grad_stats(metric_names: Collection[str], stats: Sequence[str] = GRAD_BUCKET_STATS) -> list[str]:
    """Those of ``stats`` with at least one bucket among ``metric_names``."""
    return [stat for stat in stats if grad_bucket_metrics(metric_names, stat)]
