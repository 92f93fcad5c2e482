"""Aggregates over seeds: per-run summaries, per-group statistics and comparisons against a baseline group.

Randomness comes only from ``random_state``; definitions: docs/analysis.md ("Definitions").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.bootstrap import DEFAULT_BOOTSTRAP, MIN_BOOTSTRAP_N, bca_intervals, bootstrap_ci
from analysis.frames import IDENTITY_COLUMNS, factor_columns
from analysis.groups import Strata, baseline_strata, check_columns, group_items, group_key, matching_rows
from analysis.statistics import (DEFAULT_CONFIDENCE, DEFAULT_LEVEL, DEFAULT_POWER, RandomState, rowwise_iqm,
                                 check_confidence, check_power_arguments, holm_adjust, improvement_statistic,
                                 interquartile_mean, minimum_detectable_effect, probability_of_improvement, t_bounds,
                                 t_tests)
from dataflex_rl import keys
from dataflex_rl.keys import BASELINE_ALPHA, BASELINE_PRESET

DEFAULT_FINAL_WINDOW = 5
SUMMARY_STATISTICS: tuple[str, ...] = ("final", "final_window", "auc", "best", "steps_to_threshold")
# Metrics where smaller is better (losses, timings); any other is higher-is-better
LOWER_IS_BETTER_KEYS = frozenset({keys.PG_LOSS, keys.KL_LOSS, keys.GRAD_CLIP_FRAC})
LOWER_IS_BETTER_PREFIXES: tuple[str, ...] = ("timing_s/",)
AGGREGATE_COLUMNS: tuple[str, ...] = ("n", "mean", "std", "iqm", "ci_low", "ci_high", "iqm_ci_low", "iqm_ci_high")
DIFFERENCE_COLUMNS: tuple[str, ...] = (
    "n_pairs", "mean", "baseline_mean", "mean_difference", "std_difference", "ci_low", "ci_high", "p_value",
    "p_holm", "mde", "prob_improvement", "prob_ci_low", "prob_ci_high", "method")


def lower_is_better(metric: str, minimize: Collection[str] | None = None) -> bool:
    """Whether smaller is better for ``metric``: ``minimize`` when given, else the defaults above."""
    if minimize is not None:
        return metric in minimize
    return metric in LOWER_IS_BETTER_KEYS or metric.startswith(LOWER_IS_BETTER_PREFIXES)


def _codes(series: pd.Series) -> np.ndarray:
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.codes.to_numpy(dtype=np.int64)
    return pd.factorize(series, use_na_sentinel=False)[0].astype(np.int64)


def segments(long: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """``long`` ordered by (sweep, run, metric, step), last row of a repeated step kept, and its segments' bounds."""
    sweep_codes, run_codes, metric_codes = (_codes(long[c]) for c in ("sweep", "run", "metric"))
    n_runs = int(run_codes.max(initial=0)) + 1
    n_metrics = int(metric_codes.max(initial=0)) + 1
    segment_key = (sweep_codes * n_runs + run_codes) * n_metrics + metric_codes
    steps = long["step"].to_numpy(dtype=np.int64)
    key_step = np.diff(segment_key)
    ordered = bool(np.all(key_step >= 0) and np.all(np.diff(steps)[key_step == 0] > 0))
    if not ordered:
        order = np.lexsort((steps, segment_key))
        segment_key, steps = segment_key[order], steps[order]
        keep = np.append((segment_key[1:] != segment_key[:-1]) | (steps[1:] != steps[:-1]), True)
        long = long.iloc[order[keep]]
        segment_key = segment_key[keep]
    if not len(segment_key):
        empty = np.empty(0, dtype=np.int64)
        return long, empty, empty
    starts = np.flatnonzero(np.append(True, segment_key[1:] != segment_key[:-1]))
    ends = np.append(starts[1:], len(segment_key))
    return long, starts, ends


def run_summaries(long: pd.DataFrame, *, metrics: Sequence[str] | None = None, final_window: int = DEFAULT_FINAL_WINDOW,
                  thresholds: Mapping[str, float] | None = None,
                  minimize: Collection[str] | None = None) -> pd.DataFrame:
    """One row per (run, metric): identity, extra per-run columns, ``n_points, first_step, last_step`` and
    :data:`SUMMARY_STATISTICS`; ``thresholds``: ``{metric: value}`` for ``steps_to_threshold``."""
    if final_window < 1:
        raise ValueError(f"final_window={final_window!r} must be a positive number of logged values")
    if metrics is not None:
        unknown = sorted(set(metrics) - set(long["metric"].unique()))
        if unknown:
            raise KeyError(f"metrics {unknown} are not in the table; available: {sorted(long['metric'].unique())}")
        long = long[long["metric"].isin(list(metrics))]
    frame, starts, ends = segments(long)
    # extra per-run columns of ``long`` (from load.add_run_columns) ride along, so they can be group keys
    extra = [c for c in long.columns if c not in (*IDENTITY_COLUMNS, "step", "metric", "value")]
    identity = frame.iloc[starts][[*IDENTITY_COLUMNS, *extra, "metric"]].reset_index(drop=True)
    if not starts.size:
        return identity.assign(**{c: pd.Series(dtype=np.float64) for c in (
            "n_points", "first_step", "last_step", *SUMMARY_STATISTICS)})
    steps = frame["step"].to_numpy(dtype=np.int64)
    values = frame["value"].to_numpy(dtype=np.float64)
    segment_metrics = identity["metric"].astype(str).to_numpy()
    minimise = np.array([lower_is_better(m, minimize) for m in segment_metrics])
    count = ends - starts
    # final window: reduceat over interleaved (window start, end) pairs; a trailing 0 makes `end == len` valid
    window_starts = np.maximum(starts, ends - final_window)
    window_sums = np.add.reduceat(np.append(values, 0.0), np.column_stack([window_starts, ends]).ravel())[::2]
    # AUC: trapezoids between consecutive rows, zeroed where the next row starts another segment, over the step span
    trapezoids = np.zeros_like(values)
    trapezoids[:-1] = 0.5 * (values[1:] + values[:-1]) * np.diff(steps).astype(np.float64)
    trapezoids[ends - 1] = 0.0
    span = (steps[ends - 1] - steps[starts]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = np.where(span > 0, np.add.reduceat(trapezoids, starts) / span, values[starts])
    reached_step = np.full(starts.size, np.nan)
    if thresholds:  # first step at which a segment reaches its metric's threshold (<= when lower is better)
        row_threshold = np.repeat(np.array([thresholds.get(m, np.nan) for m in segment_metrics], dtype=np.float64),
                                  count)
        reached = np.where(np.repeat(minimise, count), values <= row_threshold, values >= row_threshold)
        first = np.minimum.reduceat(np.where(reached, np.arange(values.size), values.size), starts)
        reached_step[first < ends] = steps[first[first < ends]]
    return identity.assign(
        n_points=count, first_step=steps[starts], last_step=steps[ends - 1], final=values[ends - 1],
        final_window=window_sums / (ends - window_starts), auc=auc,
        best=np.where(minimise, np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)),
        steps_to_threshold=reached_step)


def aggregate_runs(summaries: pd.DataFrame, *, value: str = "final_window", group_keys: Sequence[str] = ("alpha",),
                   stratify_by: Sequence[str] = (), confidence: float = DEFAULT_CONFIDENCE,
                   n_bootstrap: int = DEFAULT_BOOTSTRAP, random_state: RandomState = 0) -> pd.DataFrame:
    """Per (group, metric) :data:`AGGREGATE_COLUMNS` of one per-run ``value``: Student-t interval of the mean, BCa
    interval of the IQM (stratified percentile interval with ``stratify_by``, for pooled sweeps)."""
    check_columns(summaries, [*group_keys, *stratify_by, "metric", value], "group_keys/stratify_by/value")
    check_confidence(confidence)
    rng = np.random.default_rng(random_state)
    values = summaries[value].to_numpy(dtype=np.float64)
    finite = np.isfinite(values)
    records: list[dict[str, Any]] = []
    bootstrapped: list[tuple[int, np.ndarray]] = []  # (record index, sample) of the IQM intervals to draw
    for key, positions in group_items(summaries, [*group_keys, "metric"]):
        positions = positions[finite[positions]]
        record: dict[str, Any] = dict(zip([*group_keys, "metric"], key, strict=True))
        sample = values[positions]
        record["n"] = int(sample.size)
        records.append(record)
        if not sample.size:
            continue
        record.update(mean=float(sample.mean()), std=float(sample.std(ddof=1)) if sample.size > 1 else np.nan,
                      iqm=float(rowwise_iqm(sample[None, :])[0]), iqm_ci_low=np.nan,
                      iqm_ci_high=np.nan)
        if stratify_by and sample.size >= MIN_BOOTSTRAP_N:
            strata_codes = summaries.iloc[positions].groupby(list(stratify_by), dropna=False, observed=True).indices
            strata = [sample[p] for _, p in sorted(strata_codes.items(), key=lambda item: str(item[0]))]
            record["iqm_ci_low"], record["iqm_ci_high"] = bootstrap_ci(
                strata, interquartile_mean, confidence=confidence, n_bootstrap=n_bootstrap, random_state=rng)
        elif not stratify_by:
            bootstrapped.append((len(records) - 1, sample))
    with_values = [record for record in records if record["n"]]
    n = np.array([record["n"] for record in with_values], dtype=np.float64)
    lows, highs = t_bounds([record["mean"] for record in with_values],
                           np.array([record["std"] for record in with_values], dtype=np.float64) / np.sqrt(n), n - 1,
                           confidence)
    for record, low, high in zip(with_values, lows, highs, strict=True):
        record["ci_low"], record["ci_high"] = float(low), float(high)
    intervals = bca_intervals([(sample,) for _, sample in bootstrapped], interquartile_mean, paired=False,
                              confidence=confidence, n_bootstrap=n_bootstrap, rng=rng)
    for (index, _), (low, high) in zip(bootstrapped, intervals, strict=True):
        records[index]["iqm_ci_low"], records[index]["iqm_ci_high"] = low, high
    return pd.DataFrame.from_records(records, columns=[*group_keys, "metric", *AGGREGATE_COLUMNS])


Samples = list[tuple[tuple[Any, ...], np.ndarray, np.ndarray]]


def _metric_samples(of_metric: pd.DataFrame, metric: str, value: str, group_keys: Sequence[str],
                    baseline_key: tuple[Any, ...], pair_on: Sequence[str], paired: bool) -> Samples:
    """``(group key, x, y)`` for every group but the baseline, paired on ``pair_on`` (a repeated key keeps its last)."""
    reference_positions = np.flatnonzero(matching_rows(of_metric, dict(zip(group_keys, baseline_key, strict=True))))
    pair_frame = of_metric.iloc[reference_positions][list(pair_on)]
    duplicated = pair_frame.duplicated()
    if paired and duplicated.any():
        raise ValueError(f"baseline runs repeat pair_on={list(pair_on)!r} values "
                         f"{pair_frame[duplicated].to_dict('records')[:5]} for {metric!r}; "
                         f"pair on more columns, e.g. pair_on=('sweep', 'seed')")
    metric_values = of_metric[value].to_numpy(dtype=np.float64)
    pair_keys = list(zip(*(of_metric[column].to_numpy() for column in pair_on), strict=True))
    reference_values = {pair_keys[i]: metric_values[i] for i in reference_positions}
    samples = []
    for key, positions in group_items(of_metric, group_keys):
        if group_key(key) == group_key(baseline_key):
            continue
        if paired:
            group_values = {pair_keys[i]: metric_values[i] for i in positions}
            common = [k for k in group_values if k in reference_values]
            x = np.array([group_values[k] for k in common], dtype=np.float64)
            y = np.array([reference_values[k] for k in common], dtype=np.float64)
        else:
            x, y = metric_values[positions], metric_values[reference_positions]
        samples.append((key, x, y))
    return samples


def _stratified_samples(of_metric: pd.DataFrame, metric: str, value: str, group_keys: Sequence[str], strata: Strata,
                        pair_on: Sequence[str], paired: bool) -> Samples:
    """:func:`_metric_samples` within each stratum against its baseline (empty samples where it has none)."""
    strata_keys, baseline_keys = strata
    if not strata_keys:
        (baseline_key,) = baseline_keys.values()
        return _metric_samples(of_metric, metric, value, group_keys, baseline_key, pair_on, paired)
    samples = []
    for stratum, positions in group_items(of_metric, strata_keys):
        subset = of_metric.iloc[positions]
        baseline_key = baseline_keys.get(group_key(stratum))
        if baseline_key is None or not matching_rows(subset, dict(zip(group_keys, baseline_key, strict=True))).any():
            empty = np.empty(0, dtype=np.float64)
            samples += [(key, empty, empty) for key, _ in group_items(subset, group_keys)]
            continue
        samples += _metric_samples(subset, metric, value, group_keys, baseline_key, pair_on, paired)
    return samples


def paired_differences(summaries: pd.DataFrame, *, value: str = "final_window", group_keys: Sequence[str] = ("alpha",),
                       baseline: Mapping[str, Any] | None = None, pair_on: Sequence[str] = ("seed",),
                       minimize: Collection[str] | None = None, confidence: float = DEFAULT_CONFIDENCE,
                       n_bootstrap: int = DEFAULT_BOOTSTRAP, random_state: RandomState = 0, paired: bool = True,
                       power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL) -> pd.DataFrame:
    """Per (group, metric) :data:`DIFFERENCE_COLUMNS` against the baseline group (default ``alpha = 0``; one per
    stratum of the other factors), paired on ``pair_on``, or by Welch's t with ``paired=False``."""
    baseline = dict(baseline if baseline is not None else {"alpha": BASELINE_ALPHA})
    check_columns(summaries, [*group_keys, *pair_on, *baseline, "metric", value], "group_keys/pair_on/baseline/value")
    check_confidence(confidence)
    check_power_arguments(power, level)
    strata = baseline_strata(summaries, group_keys, baseline)
    method = "paired t" if paired else "Welch t"
    records: list[dict[str, Any]] = []
    compared: list[tuple[int, np.ndarray, np.ndarray, float]] = []  # (record index, x, y, sign of "better")
    metric_records: list[range] = []  # the records of each metric, for Holm
    for metric in sorted(summaries["metric"].astype(str).unique()):
        of_metric = summaries[(summaries["metric"].astype(str) == metric).to_numpy() & np.isfinite(
            summaries[value].to_numpy(dtype=np.float64))]
        sign = -1.0 if lower_is_better(metric, minimize) else 1.0
        first = len(records)
        for key, x, y in _stratified_samples(of_metric, metric, value, group_keys, strata, pair_on, paired):
            if x.size and y.size:
                compared.append((len(records), x, y, sign))
            records.append({**dict(zip(group_keys, key, strict=True)), "metric": metric, "n_pairs": 0,
                            "method": method})
        metric_records.append(range(first, len(records)))
    tests = t_tests([(x, y) for _, x, y, _ in compared], paired=paired, confidence=confidence)
    for (index, x, y, sign), test in zip(compared, tests, strict=True):
        n = int(x.size) if paired else int(min(x.size, y.size))
        records[index].update(
            n_pairs=n, mean=float(x.mean()), baseline_mean=float(y.mean()),
            **{column: test[column] for column in ("mean_difference", "std_difference", "ci_low", "ci_high",
                                                   "p_value")},
            mde=minimum_detectable_effect(test["std_difference"], n, power=power, level=level, paired=paired),
            prob_improvement=probability_of_improvement(sign * x, sign * y))
    for positions in metric_records:
        adjusted = holm_adjust([records[i].get("p_value", np.nan) for i in positions])
        for i, p_holm in zip(positions, adjusted, strict=True):
            records[i]["p_holm"] = p_holm
    intervals = bca_intervals([(sign * x, sign * y) for _, x, y, sign in compared], improvement_statistic,
                              paired=paired, confidence=confidence, n_bootstrap=n_bootstrap,
                              rng=np.random.default_rng(random_state))
    for (index, *_), (low, high) in zip(compared, intervals, strict=True):
        records[index]["prob_ci_low"], records[index]["prob_ci_high"] = low, high
    return pd.DataFrame.from_records(records, columns=[*group_keys, "metric", *DIFFERENCE_COLUMNS])


def default_group_keys(runs: pd.DataFrame) -> tuple[str, ...]:
    """``mechanism_label`` when it varies, ``alpha``, then every other factor column taking more than one value."""
    labels = runs["mechanism_label"].dropna().unique() if "mechanism_label" in runs.columns else []
    summary_columns = ("n_points", "first_step", "last_step", *SUMMARY_STATISTICS)
    factors = tuple(column for column in factor_columns(runs, exclude=summary_columns)
                    if runs[column].nunique(dropna=False) > 1)
    return (*(("mechanism_label",) if len(labels) > 1 else ()), "alpha", *factors)


def default_baseline(frame: pd.DataFrame, group_keys: Sequence[str]) -> dict[str, Any] | None:
    """The baseline selector (mechanism label ``baseline``, else ``alpha == 0``), or None when ambiguous."""
    candidates: list[dict[str, Any]] = []
    if "mechanism_label" in group_keys and matching_rows(frame, {"mechanism_label": BASELINE_PRESET}).any():
        candidates.append({"mechanism_label": BASELINE_PRESET})
    if "alpha" in group_keys:
        candidates.append({"alpha": BASELINE_ALPHA})
    for selector in candidates:
        selected = frame.loc[matching_rows(frame, selector), list(group_keys)].drop_duplicates()
        if len(selected) == 1:
            return {key: selected.iloc[0][key] for key in group_keys}
        fixed = [key for key in ("mechanism_label", "alpha") if key in group_keys]
        if len(selected) > 1 and len(selected[fixed].drop_duplicates()) == 1:
            return {**selector, **{key: selected.iloc[0][key] for key in fixed}}
    return None
