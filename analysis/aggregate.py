"""Aggregates over seeds: aligned curves, per-run summaries, per-group statistics with bootstrap CIs, paired deltas.

Everything takes the long table of :mod:`analysis.load` (``sweep, run, ..., alpha, seed, step, metric, value``) or the
per-run summary table built from it, and returns a new DataFrame; randomness comes only from ``random_state``.

Definitions (``x`` holds one value per run, i.e. per seed, of a group):

- **IQM**: interquartile mean, ``scipy.stats.trim_mean(x, 0.25)``: drop ``int(0.25 * n)`` values at each end of the
  sorted sample, average the rest (rliable's definition).
- **Bootstrap CI**: percentile interval of a statistic over ``n_bootstrap`` resamples; a *stratified* bootstrap
  resamples each stratum (e.g. each sweep, when several are pooled) with replacement to its own size.
- **Final window**: mean of a run's last ``K`` logged values of a metric (for ``val/accuracy``, the last ``K``
  evaluations).
- **AUC**: trapezoid integral of value over step divided by the step span of the run
  (``last_step - first_step``), i.e. the time-averaged value; a run logged at one step gets that value.
- **Best**: max (min for lower-is-better metrics) over logged values; **steps to threshold**: first logged step whose
  value is ``>= threshold`` (``<=`` for lower-is-better), NaN when never reached.
- **Curve alignment**: each run's values are forward-filled onto a common step grid between its first and last logged
  step; grid points before its first or after its last step are NaN (never extrapolated), and a group's statistic at
  a step uses only the runs that cover that step (``n`` says how many).
- **Paired difference**: ``x_seed - baseline_seed`` over the seeds present in both groups, mean with a paired
  bootstrap CI; **probability of improvement** ``P(X > Y) = mean_ij([x_i > y_j] + 0.5 [x_i == y_j])`` over all pairs
  of those seeds (the Mann-Whitney form rliable uses), ``P(X < Y)`` for lower-is-better metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.load import IDENTITY_COLUMNS
from dataflex_rl import keys

DEFAULT_FINAL_WINDOW = 5
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000
SUMMARY_STATISTICS: tuple[str, ...] = ("final", "final_window", "auc", "best", "steps_to_threshold")
# Metrics where a smaller value is the better one (losses, timings); everything else counts as higher-is-better
# for ``best`` and thresholds. Tables mark a best group only for metrics with a known direction (see metric_direction).
LOWER_IS_BETTER_KEYS = frozenset({keys.PG_LOSS, keys.KL_LOSS, keys.GRAD_CLIP_FRAC})
LOWER_IS_BETTER_PREFIXES: tuple[str, ...] = ("timing_s/",)
HIGHER_IS_BETTER_KEYS = frozenset({keys.TRAIN_ACCURACY})
HIGHER_IS_BETTER_PREFIXES: tuple[str, ...] = (keys.VAL_ACCURACY, "critic/score/")

RandomState = int | np.random.Generator | None
Statistic = Callable[..., np.ndarray]


def lower_is_better(metric: str, minimize: Collection[str] | None = None) -> bool:
    """Whether smaller is better for ``metric``: ``minimize`` when given, else the project defaults above."""
    if minimize is not None:
        return metric in minimize
    return metric in LOWER_IS_BETTER_KEYS or metric.startswith(LOWER_IS_BETTER_PREFIXES)


def metric_direction(
    metric: str, minimize: Collection[str] | None = None, maximize: Collection[str] | None = None
) -> int:
    """+1 when larger is better, -1 when smaller is better, 0 when neither (e.g. ``response_length/mean``).

    ``minimize`` / ``maximize`` override the project defaults (accuracy and reward up; losses and timings down).
    """
    if minimize is not None and metric in minimize:
        return -1
    if maximize is not None and metric in maximize:
        return 1
    if metric in LOWER_IS_BETTER_KEYS or metric.startswith(LOWER_IS_BETTER_PREFIXES):
        return -1
    if metric in HIGHER_IS_BETTER_KEYS or metric.startswith(HIGHER_IS_BETTER_PREFIXES):
        return 1
    return 0


def _check_columns(frame: pd.DataFrame, columns: Sequence[str], argument: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KeyError(f"{argument}={list(columns)!r}: no column {missing} (columns: {list(frame.columns)})")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must lie strictly between 0 and 1 (e.g. 0.95)")


# --- statistics of one sample ------------------------------------------------------------------------------------


def interquartile_mean(values: Any, axis: int | None = None) -> Any:
    """IQM: ``scipy.stats.trim_mean(values, 0.25, axis)``, the mean of the middle 50% of the sorted values."""
    return stats.trim_mean(values, 0.25, axis=axis)


def stratified_bootstrap(
    strata: Sequence[Any],
    statistic: Statistic = np.mean,
    *,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    random_state: RandomState = None,
) -> np.ndarray:
    """Bootstrap distribution ``(n_bootstrap,)`` of ``statistic`` over stratified resamples.

    ``strata``: 1-D samples; each is resampled with replacement to its own size and the resamples are concatenated
    into one row of a ``(n_bootstrap, total)`` array; ``statistic(array, axis=1)`` gives the distribution.
    A flat sequence of numbers counts as one stratum.
    """
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap={n_bootstrap!r} must be a positive integer")
    if all(np.ndim(element) == 0 for element in strata):
        strata = [np.asarray(strata, dtype=np.float64)]
    samples = [np.asarray(stratum, dtype=np.float64).ravel() for stratum in strata]
    samples = [s for s in samples if s.size]
    if not samples:
        raise ValueError("stratified_bootstrap needs at least one non-empty stratum")
    rng = np.random.default_rng(random_state)
    resampled = np.concatenate(
        [s[rng.integers(0, s.size, size=(n_bootstrap, s.size))] for s in samples], axis=1)
    return np.asarray(statistic(resampled, axis=1), dtype=np.float64)


def percentile_interval(distribution: np.ndarray, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Percentile interval ``(low, high)`` holding ``confidence`` of a bootstrap distribution."""
    _check_confidence(confidence)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(distribution, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_ci(
    strata: Sequence[Any],
    statistic: Statistic = np.mean,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    random_state: RandomState = None,
) -> tuple[float, float]:
    """Percentile ``confidence`` interval of ``statistic`` under the stratified bootstrap (see above)."""
    distribution = stratified_bootstrap(strata, statistic, n_bootstrap=n_bootstrap, random_state=random_state)
    return percentile_interval(distribution, confidence)


def probability_of_improvement(x: Any, y: Any) -> float:
    """``P(X > Y)`` over all pairs ``(x_i, y_j)``, ties counting half: ``mean([x_i > y_j] + 0.5 [x_i == y_j])``."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if not x.size or not y.size:
        raise ValueError(f"probability_of_improvement needs two non-empty samples, got sizes {x.size} and {y.size}")
    greater = (x[:, None] > y[None, :]).mean()
    ties = (x[:, None] == y[None, :]).mean()
    return float(greater + 0.5 * ties)


# --- curves ------------------------------------------------------------------------------------------------------


def _codes(series: pd.Series) -> np.ndarray:
    """Integer codes of a column (its categorical codes, or codes of a factorisation)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        return series.cat.codes.to_numpy(dtype=np.int64)
    return pd.factorize(series, use_na_sentinel=False)[0].astype(np.int64)


def _segments(long: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Order ``long`` by (sweep, run, metric, step) unless it already is; return it with segment starts and ends.

    A segment is one run's one metric; ``starts``/``ends`` ``(n_segments,)`` are row positions (end exclusive).
    A step repeated inside a segment keeps its last row.
    """
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


def _select_metric(long: pd.DataFrame, metric: str) -> pd.DataFrame:
    available = long["metric"].unique()
    if metric not in set(available):
        raise KeyError(f"metric={metric!r} is not in the table; available: {sorted(map(str, available))}")
    return long[long["metric"] == metric]


def align_curves(
    long: pd.DataFrame, metric: str, step_grid: Any = None, extra_columns: Sequence[str] = ()
) -> pd.DataFrame:
    """One metric of every run on a common step grid: DataFrame ``(n_grid, n_runs)``.

    Index ``step`` = ``step_grid`` (default: every step any run logged the metric at); columns a MultiIndex of the
    identity columns plus ``extra_columns`` of ``long`` (one column per run). Values are forward-filled within each
    run's ``[first, last]`` logged step and NaN outside it (see module doc).
    """
    frame, starts, ends = _segments(_select_metric(long, metric))
    steps = frame["step"].to_numpy(dtype=np.int64)
    values = frame["value"].to_numpy(dtype=np.float64)
    grid = np.unique(steps) if step_grid is None else np.asarray(step_grid, dtype=np.int64)
    if grid.ndim != 1 or (grid.size > 1 and np.any(np.diff(grid) <= 0)):
        raise ValueError("step_grid must be a 1-D increasing sequence of steps")
    matrix = np.full((grid.size, starts.size), np.nan)
    for column, (start, end) in enumerate(zip(starts, ends, strict=True)):
        run_steps = steps[start:end]
        position = np.searchsorted(run_steps, grid, side="right") - 1
        covered = (position >= 0) & (grid <= run_steps[-1])
        matrix[covered, column] = values[start:end][position[covered]]
    id_columns = list(dict.fromkeys([*IDENTITY_COLUMNS, *extra_columns]))
    _check_columns(frame, id_columns, "extra_columns")
    identity = frame.iloc[starts][id_columns]
    columns = pd.MultiIndex.from_frame(identity.astype(dict.fromkeys(id_columns, object)))
    return pd.DataFrame(matrix, index=pd.Index(grid, name="step"), columns=columns)


def _rowwise_interquartile_mean(block: np.ndarray) -> np.ndarray:
    """IQM of each row of ``(rows, n)`` ignoring NaN: per row, scipy's trim_mean(finite values, 0.25)."""
    finite = np.isfinite(block)
    count = finite.sum(axis=1)
    ordered = np.sort(np.where(finite, block, np.inf), axis=1)  # finite values first, in order
    cumulative = np.concatenate(
        [np.zeros((block.shape[0], 1)), np.cumsum(np.where(np.isfinite(ordered), ordered, 0.0), axis=1)], axis=1)
    cut = np.floor(0.25 * count).astype(np.int64)
    upper = count - cut
    rows = np.arange(block.shape[0])
    kept = upper - cut
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(kept > 0, (cumulative[rows, upper] - cumulative[rows, cut]) / kept, np.nan)


def aggregate_curves(
    long: pd.DataFrame,
    metric: str,
    *,
    group_keys: Sequence[str] = ("alpha",),
    step_grid: Any = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = 1000,
    random_state: RandomState = 0,
) -> pd.DataFrame:
    """Per group and grid step: ``n, mean, std, iqm, ci_low, ci_high`` (bootstrap CI of the mean over runs).

    Returns one row per (group, step) where at least one run of the group covers the step, columns
    ``[*group_keys, step, n, mean, std, iqm, ci_low, ci_high]``. The bootstrap draws run counts
    ``C ~ Multinomial(n, 1/n)`` of shape ``(n_bootstrap, n)`` once per group, so every step shares the same resamples:
    ``mean_b = (C @ x) / (C @ covered)``.
    """
    _check_confidence(confidence)
    aligned = align_curves(long, metric, step_grid, [k for k in group_keys if k not in IDENTITY_COLUMNS])
    columns = aligned.columns.to_frame(index=False)
    _check_columns(columns, group_keys, "group_keys")
    matrix = aligned.to_numpy()
    grid = aligned.index.to_numpy()
    rng = np.random.default_rng(random_state)
    tail = (1.0 - confidence) / 2.0
    frames = []
    grouped = columns.groupby(list(group_keys), dropna=False, sort=True).indices
    for group, positions in sorted(grouped.items(), key=lambda item: str(item[0])):
        block = matrix[:, positions]
        covered = np.isfinite(block)
        count = covered.sum(axis=1)
        rows = count > 0
        block, covered, count = block[rows], covered[rows], count[rows]
        filled = np.where(covered, block, 0.0)
        mean = filled.sum(axis=1) / count
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = ((np.where(covered, block - mean[:, None], 0.0)) ** 2).sum(axis=1) / (count - 1)
        draws = rng.multinomial(len(positions), np.full(len(positions), 1.0 / len(positions)), size=n_bootstrap)
        with np.errstate(invalid="ignore", divide="ignore"):
            boot_means = (draws @ filled.T) / (draws @ covered.T.astype(np.float64))
        low, high = np.nanquantile(boot_means, [tail, 1.0 - tail], axis=0)
        values = group if isinstance(group, tuple) else (group,)
        frame = pd.DataFrame({key: [value] * int(rows.sum()) for key, value in zip(group_keys, values, strict=True)})
        frame["step"] = grid[rows]
        frame["n"] = count
        frame["mean"] = mean
        frame["std"] = np.where(count > 1, np.sqrt(variance), np.nan)
        frame["iqm"] = _rowwise_interquartile_mean(block)
        frame["ci_low"] = low
        frame["ci_high"] = high
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*group_keys, "step", "n", "mean", "std", "iqm", "ci_low", "ci_high"])
    return pd.concat(frames, ignore_index=True)


# --- per-run summaries -------------------------------------------------------------------------------------------


def run_summaries(
    long: pd.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    final_window: int = DEFAULT_FINAL_WINDOW,
    thresholds: Mapping[str, float] | None = None,
    minimize: Collection[str] | None = None,
) -> pd.DataFrame:
    """One row per (run, metric): identity columns (plus any extra per-run columns of ``long``), ``metric``,
    ``n_points, first_step, last_step``, then
    :data:`SUMMARY_STATISTICS` (definitions in the module doc; ``final_window`` = mean of the last ``final_window``
    logged values). ``thresholds``: ``{metric: value}`` for ``steps_to_threshold`` (NaN for other metrics).

    Vectorised over all segments at once (``np.add.reduceat`` and friends), so 8 M rows take well under a second.
    """
    if final_window < 1:
        raise ValueError(f"final_window={final_window!r} must be a positive number of logged values")
    if metrics is not None:
        unknown = sorted(set(metrics) - set(long["metric"].unique()))
        if unknown:
            raise KeyError(f"metrics {unknown} are not in the table; available: {sorted(long['metric'].unique())}")
        long = long[long["metric"].isin(list(metrics))]
    frame, starts, ends = _segments(long)
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
    window_starts = np.maximum(starts, ends - final_window)
    # reduceat over interleaved (window start, end) pairs sums each window; a trailing 0 makes `end == len` valid.
    padded = np.append(values, 0.0)
    window_sums = np.add.reduceat(padded, np.column_stack([window_starts, ends]).ravel())[::2]
    # Trapezoids between consecutive rows, zeroed where the next row starts another segment.
    trapezoids = np.zeros_like(values)
    trapezoids[:-1] = 0.5 * (values[1:] + values[:-1]) * np.diff(steps).astype(np.float64)
    trapezoids[ends - 1] = 0.0
    areas = np.add.reduceat(trapezoids, starts)
    span = (steps[ends - 1] - steps[starts]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = np.where(span > 0, areas / span, values[starts])
    best = np.where(minimise, np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts))

    reached_step = np.full(starts.size, np.nan)
    if thresholds:
        segment_threshold = np.array([thresholds.get(m, np.nan) for m in segment_metrics], dtype=np.float64)
        row_threshold = np.repeat(segment_threshold, count)
        row_minimise = np.repeat(minimise, count)
        reached = np.where(row_minimise, values <= row_threshold, values >= row_threshold)
        first = np.minimum.reduceat(np.where(reached, np.arange(values.size), values.size), starts)
        hit = first < ends
        reached_step[hit] = steps[first[hit]]

    summary = identity
    summary["n_points"] = count
    summary["first_step"] = steps[starts]
    summary["last_step"] = steps[ends - 1]
    summary["final"] = values[ends - 1]
    summary["final_window"] = window_sums / (ends - window_starts)
    summary["auc"] = auc
    summary["best"] = best
    summary["steps_to_threshold"] = reached_step
    return summary


# --- per-group statistics ----------------------------------------------------------------------------------------


def _group_items(frame: pd.DataFrame, by: Sequence[str]) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """``(key tuple, row positions)`` per group, in a stable order (so a fixed random_state gives fixed draws)."""
    indices = frame.groupby(list(by), dropna=False, sort=True, observed=True).indices
    items = [((key if isinstance(key, tuple) else (key,)), positions) for key, positions in indices.items()]
    return sorted(items, key=lambda item: tuple(str(part) for part in item[0]))


def aggregate_runs(
    summaries: pd.DataFrame,
    *,
    value: str = "final_window",
    group_keys: Sequence[str] = ("alpha",),
    stratify_by: Sequence[str] = (),
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    random_state: RandomState = 0,
) -> pd.DataFrame:
    """Per (group, metric) statistics of one per-run ``value`` column of :func:`run_summaries`.

    Returns columns ``[*group_keys, metric, n, mean, std, iqm, ci_low, ci_high, iqm_ci_low, iqm_ci_high]``: ``n``
    runs with a finite value, ``std`` with ``ddof=1``, CIs from the stratified bootstrap (strata = distinct values of
    ``stratify_by`` within the group; none = a plain bootstrap over seeds). Mean and IQM CIs share the resamples.
    """
    _check_columns(summaries, [*group_keys, *stratify_by, "metric", value], "group_keys/stratify_by/value")
    _check_confidence(confidence)
    rng = np.random.default_rng(random_state)
    tail = (1.0 - confidence) / 2.0
    values = summaries[value].to_numpy(dtype=np.float64)
    finite = np.isfinite(values)
    records = []
    for key, positions in _group_items(summaries, [*group_keys, "metric"]):
        positions = positions[finite[positions]]
        record: dict[str, Any] = dict(zip([*group_keys, "metric"], key, strict=True))
        sample = values[positions]
        record["n"] = int(sample.size)
        if not sample.size:
            records.append(record)
            continue
        if stratify_by:
            strata_codes = summaries.iloc[positions].groupby(list(stratify_by), dropna=False, observed=True).indices
            strata = [sample[p] for _, p in sorted(strata_codes.items(), key=lambda item: str(item[0]))]
        else:
            strata = [sample]
        resampled = np.concatenate([s[rng.integers(0, s.size, size=(n_bootstrap, s.size))] for s in strata], axis=1)
        mean_low, mean_high = np.quantile(resampled.mean(axis=1), [tail, 1.0 - tail])
        iqm_low, iqm_high = np.quantile(interquartile_mean(resampled, axis=1), [tail, 1.0 - tail])
        record.update(
            mean=float(sample.mean()), std=float(sample.std(ddof=1)) if sample.size > 1 else np.nan,
            iqm=float(interquartile_mean(sample)), ci_low=float(mean_low), ci_high=float(mean_high),
            iqm_ci_low=float(iqm_low), iqm_ci_high=float(iqm_high),
        )
        records.append(record)
    columns = [*group_keys, "metric", "n", "mean", "std", "iqm", "ci_low", "ci_high", "iqm_ci_low", "iqm_ci_high"]
    return pd.DataFrame.from_records(records, columns=columns)


def _matches(frame: pd.DataFrame, selector: Mapping[str, Any]) -> np.ndarray:
    """Rows whose columns equal every ``selector`` item (floats compared with ``np.isclose``)."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in selector.items():
        column_values = frame[column]
        if pd.api.types.is_float_dtype(column_values.dtype) and isinstance(wanted, (int, float)):
            mask &= np.isclose(column_values.to_numpy(dtype=np.float64), float(wanted))
        else:
            mask &= (column_values.astype(str) == str(wanted)).to_numpy(dtype=bool)
    return mask


def paired_differences(
    summaries: pd.DataFrame,
    *,
    value: str = "final_window",
    group_keys: Sequence[str] = ("alpha",),
    baseline: Mapping[str, Any] | None = None,
    pair_on: Sequence[str] = ("seed",),
    minimize: Collection[str] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    random_state: RandomState = 0,
) -> pd.DataFrame:
    """Per (group, metric) against the baseline group, pairing runs on ``pair_on`` (the seed).

    ``baseline``: column values selecting the baseline group, default ``{"alpha": 0.0}``; it must select exactly one
    group of ``group_keys``. Returns ``[*group_keys, metric, n_pairs, mean, baseline_mean, mean_difference, ci_low,
    ci_high, prob_improvement, prob_ci_low, prob_ci_high]`` for every other group (definitions in the module doc;
    the CIs resample the pairs together). Groups with no seed in common get ``n_pairs = 0`` and NaN.
    """
    baseline = dict(baseline if baseline is not None else {"alpha": 0.0})
    _check_columns(summaries, [*group_keys, *pair_on, *baseline, "metric", value], "group_keys/pair_on/baseline/value")
    _check_confidence(confidence)
    is_baseline = _matches(summaries, baseline)
    baseline_groups = summaries.loc[is_baseline, list(group_keys)].drop_duplicates()
    if len(baseline_groups) != 1:
        found = baseline_groups.to_dict("records")
        raise ValueError(f"baseline={baseline!r} selects {len(found)} groups of group_keys={list(group_keys)!r} "
                         f"({found[:5]}); it must select exactly one (add keys to the baseline)")
    baseline_key = tuple(baseline_groups.iloc[0])
    rng = np.random.default_rng(random_state)
    tail = (1.0 - confidence) / 2.0
    records = []
    for metric in sorted(summaries["metric"].astype(str).unique()):
        of_metric = summaries[(summaries["metric"].astype(str) == metric).to_numpy() & np.isfinite(
            summaries[value].to_numpy(dtype=np.float64))]
        sign = -1.0 if lower_is_better(metric, minimize) else 1.0
        reference = of_metric[_matches(of_metric, dict(zip(group_keys, baseline_key, strict=True)))]
        duplicated = reference[list(pair_on)].duplicated()
        if duplicated.any():
            raise ValueError(f"baseline runs repeat pair_on={list(pair_on)!r} values "
                             f"{reference.loc[duplicated, list(pair_on)].to_dict('records')[:5]} for {metric!r}; "
                             f"pair on more columns, e.g. pair_on=('sweep', 'seed')")
        reference_values = reference.set_index(list(pair_on))[value]
        for key, positions in _group_items(of_metric, group_keys):
            if tuple(str(k) for k in key) == tuple(str(k) for k in baseline_key):
                continue
            group = of_metric.iloc[positions].set_index(list(pair_on))[value]
            group = group[~group.index.duplicated(keep="last")]
            common = group.index.intersection(reference_values.index)
            x = group.loc[common].to_numpy(dtype=np.float64)
            y = reference_values.loc[common].to_numpy(dtype=np.float64)
            record: dict[str, Any] = {**dict(zip(group_keys, key, strict=True)), "metric": metric,
                                      "n_pairs": int(x.size)}
            if x.size:
                draws = rng.integers(0, x.size, size=(n_bootstrap, x.size))
                differences = x - y
                boot_x, boot_y = sign * x[draws], sign * y[draws]
                boot_probability = ((boot_x[:, :, None] > boot_y[:, None, :]).mean(axis=(1, 2))
                                    + 0.5 * (boot_x[:, :, None] == boot_y[:, None, :]).mean(axis=(1, 2)))
                record.update(
                    mean=float(x.mean()), baseline_mean=float(y.mean()), mean_difference=float(differences.mean()),
                    ci_low=float(np.quantile(differences[draws].mean(axis=1), tail)),
                    ci_high=float(np.quantile(differences[draws].mean(axis=1), 1.0 - tail)),
                    prob_improvement=probability_of_improvement(sign * x, sign * y),
                    prob_ci_low=float(np.quantile(boot_probability, tail)),
                    prob_ci_high=float(np.quantile(boot_probability, 1.0 - tail)),
                )
            records.append(record)
    columns = [*group_keys, "metric", "n_pairs", "mean", "baseline_mean", "mean_difference", "ci_low", "ci_high",
               "prob_improvement", "prob_ci_low", "prob_ci_high"]
    return pd.DataFrame.from_records(records, columns=columns)


# --- defaults for a sweep ----------------------------------------------------------------------------------------


def default_group_keys(runs: pd.DataFrame) -> tuple[str, ...]:
    """``("alpha",)``, or ``("mechanism_label", "alpha")`` when the runs hold more than one mechanism configuration."""
    labels = runs["mechanism_label"].dropna().unique() if "mechanism_label" in runs.columns else []
    return ("mechanism_label", "alpha") if len(labels) > 1 else ("alpha",)


def default_baseline(frame: pd.DataFrame, group_keys: Sequence[str]) -> dict[str, Any] | None:
    """The baseline selector for :func:`paired_differences`, or None when none is unambiguous.

    With mechanism labels: the ``baseline`` label if present; otherwise (or without labels) ``alpha == 0``.
    """
    candidates: list[dict[str, Any]] = []
    if "mechanism_label" in group_keys and (frame["mechanism_label"].astype(str) == "baseline").any():
        candidates.append({"mechanism_label": "baseline"})
    if "alpha" in group_keys:
        candidates.append({"alpha": 0.0})
    for selector in candidates:
        selected = frame.loc[_matches(frame, selector), list(group_keys)].drop_duplicates()
        if len(selected) == 1:
            return {key: selected.iloc[0][key] for key in group_keys}
    return None
