"""Aggregates over seeds: aligned curves, per-run summaries, per-group statistics, paired deltas, power.

Everything takes the long table of :mod:`analysis.load` (``sweep, run, ..., alpha, seed, step, metric, value``) or the
per-run summary table built from it, and returns a new DataFrame; randomness comes only from ``random_state``.

Definitions (``x`` holds one value per run, i.e. per seed, of a group; ``n`` its size):

- **Mean interval**: Student t, ``mean +- t_{1-a/2, n-1} s / sqrt(n)`` (``s`` with ``ddof=1``); exact coverage for
  normal data at every ``n >= 2`` (the percentile bootstrap covers ~46% at n = 2 and ~75% at n = 3). NaN at n < 2.
- **Paired difference** against the baseline on the same seed: ``d_i = x_i - y_i`` over the seeds in both groups,
  paired t interval ``mean(d) +- t_{1-a/2, n-1} s_d / sqrt(n)`` and the paired t-test p-value
  ``2 P(T_{n-1} > |mean(d)| sqrt(n) / s_d)``; **Welch** (unpaired) when ``paired=False``: standard error
  ``sqrt(s_x^2/n_x + s_y^2/n_y)`` and Welch-Satterthwaite degrees of freedom. Colas, Sigaud and Oudeyer 2018
  ("How Many Random Seeds?") recommend both for seed comparisons.
- **Holm**: with ``m`` comparisons against one baseline, the ``i``-th smallest p-value becomes
  ``max_{j <= i} min(1, (m - j + 1) p_(j))`` (family-wise error <= the level for any dependence).
- **MDE** (minimum detectable effect): the smallest true difference that a two-sided level-``a`` t-test detects with
  probability ``power`` (default 80%, 5%): power of the paired test at effect ``E`` is
  ``P(|T'| > t_{1-a/2, n-1})`` with ``T'`` noncentral t, ``df = n - 1``, noncentrality ``E sqrt(n) / s_d`` (unpaired:
  ``df = 2n - 2``, noncentrality ``E / (s sqrt(2/n))``, ``n`` per group). **Seeds needed** for a difference ``E``:
  the smallest ``n`` whose power reaches ``power``.
- **IQM**: interquartile mean, ``scipy.stats.trim_mean(x, 0.25)`` (rliable's definition). In the per-group tables
  (:func:`aggregate_runs`) it and the probability of improvement get ``scipy.stats.bootstrap`` BCa intervals, and only
  from :data:`MIN_BOOTSTRAP_N` runs on (below, the bootstrap undercovers, measured by simulation; they are NaN).
- **IQM interval of a curve step** (:func:`aggregate_curves`, :func:`iqm_t_interval`): the Tukey-McLaughlin
  trimmed-mean t interval, ``iqm +- t_{(1+c)/2, h-1} sqrt(SSW / (h (h - 1)))`` with ``g = floor(0.25 n)`` values
  trimmed at each end, ``h = n - 2g`` kept and ``SSW`` the sum of squared deviations of the winsorised sample (the
  ``g`` lowest values set to the next one up, the ``g`` highest to the next one down) from its mean: Yuen's (1974)
  standard error, the one ``scipy.stats.ttest_ind(..., trim=0.25)`` uses. With ``g = 0`` (n < 4) it is the Student-t
  interval of the mean. Simulated coverage of a nominal 95% for normal data: 0.95 at n = 3, 0.94 at n = 5 and 10
  (``docs/analysis.md``). ``scipy.stats.mstats.trimmed_mean_ci`` divides by the nominal ``1 - 2 * 0.25`` instead of
  ``h / n``, which doubles the t interval at n = 3 (coverage 0.99) and swings between 0.92 and 0.98 with n.
- **Probability of improvement** ``P(X > Y) = mean_ij([x_i > y_j] + 0.5 [x_i == y_j])`` over all pairs of the seeds
  in both groups (the Mann-Whitney form rliable uses), ``P(X < Y)`` for lower-is-better metrics.
- **Evaluation noise** of a group's mean accuracy ``p`` measured on ``N`` validation items: the binomial variance
  ``p(1-p)/N``; **training noise**: the between-seed variance ``s^2`` minus it (floored at 0).
- **Final window**: mean of a run's last ``K`` logged values of a metric (for ``val/accuracy``, the last ``K``
  evaluations).
- **AUC**: trapezoid integral of value over step divided by the step span of the run
  (``last_step - first_step``), i.e. the time-averaged value; a run logged at one step gets that value.
- **Best**: max (min for lower-is-better metrics) over logged values; **steps to threshold**: first logged step whose
  value is ``>= threshold`` (``<=`` for lower-is-better), NaN when never reached.
- **Curve alignment**: each run's values are forward-filled onto a common step grid between its first and last logged
  step; grid points before its first or after its last step are NaN (never extrapolated), and a group's statistic at
  a step uses only the runs that cover that step (``n`` says how many).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from analysis.frames import IDENTITY_COLUMNS, factor_columns
from dataflex_rl import keys

DEFAULT_FINAL_WINDOW = 5
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000
DEFAULT_POWER = 0.8
DEFAULT_LEVEL = 0.05  # two-sided test level of p-values, the MDE and seeds needed
# Reports print no interval below this many seeds (a t interval at n = 2 is exact but uselessly wide: t_{0.975,1} = 12.7).
MIN_SEEDS_FOR_INTERVAL = 3
# BCa intervals (IQM, probability of improvement) are refused below this n: simulated coverage of a nominal 95% BCa
# interval of the IQM of normal data is 0.89 at n = 5 and 0.93 at n = 8 to 20 (tests/analysis/test_analysis_coverage.py).
MIN_BOOTSTRAP_N = 8
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
    """Percentile ``confidence`` interval of ``statistic`` under the stratified bootstrap (see above).

    Not used for the reported mean and difference intervals: over a few seeds it undercovers badly (about 49% at
    n = 2, 75% at n = 3, 89% at n = 10 for a nominal 95%); see :func:`t_interval`, :func:`paired_t`.
    """
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


# --- intervals, tests and power ------------------------------------------------------------------------------------


def _finite(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]


def _t_quantile(confidence: float, df: float) -> float:
    _check_confidence(confidence)
    return _cached_t_quantile(float(confidence), float(df))


@functools.lru_cache(maxsize=4096)
def _cached_t_quantile(confidence: float, df: float) -> float:
    return float(stats.t.ppf(0.5 + confidence / 2.0, df))


def _t_quantiles(confidence: Any, df: Any) -> np.ndarray:
    """:func:`_t_quantile` elementwise over ``confidence`` and ``df`` broadcast together: ``t_{(1+c)/2, df}``, NaN
    where ``df < 1`` (fewer than 2 values). Each distinct (confidence, df) pair is computed once (and cached)."""
    confidence, df = np.broadcast_arrays(np.asarray(confidence, dtype=np.float64), np.asarray(df, dtype=np.float64))
    quantiles = np.full(df.shape, np.nan)
    valid = np.isfinite(df) & (df >= 1)
    if valid.any():
        pairs, inverse = np.unique(np.column_stack([confidence[valid], df[valid]]), axis=0, return_inverse=True)
        quantiles[valid] = np.array([_t_quantile(c, d) for c, d in pairs])[np.ravel(inverse)]
    return quantiles


def t_interval(values: Any, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Student-t interval of the mean of the finite ``values``: ``mean +- t_{(1+c)/2, n-1} s / sqrt(n)``; NaN at n < 2."""
    sample = _finite(values)
    if sample.size < 2:
        _check_confidence(confidence)
        return np.nan, np.nan
    half = _t_quantile(confidence, sample.size - 1) * sample.std(ddof=1) / np.sqrt(sample.size)
    return float(sample.mean() - half), float(sample.mean() + half)


def _t_result(difference: float, standard_error: float, df: float, confidence: float) -> dict[str, float]:
    """Interval and two-sided p-value of a t statistic ``difference / standard_error`` with ``df`` degrees of freedom."""
    if not (np.isfinite(standard_error) and df > 0):
        return {"ci_low": np.nan, "ci_high": np.nan, "p_value": np.nan}
    half = _t_quantile(confidence, df) * standard_error
    if standard_error > 0:
        p_value = float(2.0 * stats.t.sf(abs(difference) / standard_error, df))
    else:  # identical differences: no spread, the sign is certain unless the difference is 0
        p_value = 1.0 if difference == 0 else 0.0
    return {"ci_low": difference - half, "ci_high": difference + half, "p_value": p_value}


def paired_t(x: Any, y: Any, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float]:
    """Paired t on ``d = x - y`` (equal-length samples, pair ``i`` = seed ``i``).

    Returns ``n, mean_difference, std_difference, ci_low, ci_high, p_value`` (interval and p-value NaN at n < 2).
    """
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"paired_t needs samples of equal length (pairs), got {x.size} and {y.size}")
    differences = x - y
    n = differences.size
    mean = float(differences.mean()) if n else np.nan
    std = float(differences.std(ddof=1)) if n > 1 else np.nan
    result = _t_result(mean, std / np.sqrt(n) if n > 1 else np.nan, n - 1, confidence)
    return {"n": n, "mean_difference": mean, "std_difference": std, **result}


def welch_t(x: Any, y: Any, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float]:
    """Welch's unpaired t for ``mean(x) - mean(y)``: standard error ``sqrt(s_x^2/n_x + s_y^2/n_y)``, degrees of
    freedom ``se^4 / ((s_x^2/n_x)^2/(n_x-1) + (s_y^2/n_y)^2/(n_y-1))``.

    Returns ``mean_difference, std_difference`` (the pooled ``sqrt((s_x^2 + s_y^2)/2)``, the spread the MDE uses),
    ``ci_low, ci_high, p_value, df``; NaN where a sample has fewer than 2 values.
    """
    x, y = _finite(x), _finite(y)
    difference = float(x.mean() - y.mean()) if x.size and y.size else np.nan
    if x.size < 2 or y.size < 2:
        return {"mean_difference": difference, "std_difference": np.nan, "ci_low": np.nan, "ci_high": np.nan,
                "p_value": np.nan, "df": np.nan}
    var_x, var_y = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    standard_error = float(np.sqrt(var_x + var_y))
    with np.errstate(invalid="ignore", divide="ignore"):
        df = float((var_x + var_y) ** 2 / (var_x**2 / (x.size - 1) + var_y**2 / (y.size - 1)))
    if not np.isfinite(df):  # both samples constant
        df = float(x.size + y.size - 2)
    pooled = float(np.sqrt((x.var(ddof=1) + y.var(ddof=1)) / 2.0))
    return {"mean_difference": difference, "std_difference": pooled,
            **_t_result(difference, standard_error, df, confidence), "df": df}


def holm_adjust(p_values: Any) -> np.ndarray:
    """Holm step-down adjusted p-values (same order as given; NaN stays NaN and is not counted in ``m``)."""
    p = np.asarray(p_values, dtype=np.float64).ravel()
    adjusted = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    if not finite.size:
        return adjusted
    order = finite[np.argsort(p[finite], kind="stable")]
    m = order.size
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])  # (m - j + 1) p_(j) with j counted from 1
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def _check_power_arguments(power: float, level: float) -> None:
    if not 0.0 < power < 1.0:
        raise ValueError(f"power={power!r} must lie strictly between 0 and 1 (e.g. 0.8)")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r} must lie strictly between 0 and 1 (e.g. 0.05)")


def t_power(effect: float, std: float, n: int, *, level: float = DEFAULT_LEVEL, paired: bool = True) -> float:
    """Power of the two-sided level-``level`` t-test at a true difference ``effect`` (definitions in the module doc).

    ``std``: the spread of the paired differences (``paired``) or of each group (unpaired, ``n`` runs per group).
    """
    df = n - 1 if paired else 2 * n - 2
    if df < 1 or not np.isfinite(std) or std < 0:
        return np.nan
    if std == 0:
        return 1.0 if effect != 0 else level
    noncentrality = abs(effect) / (std / np.sqrt(n) if paired else std * np.sqrt(2.0 / n))
    critical = stats.t.ppf(1.0 - level / 2.0, df)
    upper = stats.nct.sf(critical, df, noncentrality)
    # the wrong-sign tail is below level / 2 and vanishes as the noncentrality grows; scipy returns NaN for it when
    # it underflows
    lower = np.nan_to_num(stats.nct.cdf(-critical, df, noncentrality), nan=0.0)
    return float(upper + lower)


def minimum_detectable_effect(
    std: float, n: int, *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL, paired: bool = True
) -> float:
    """Smallest ``|difference|`` the t-test detects with probability ``power`` at ``n`` seeds (pairs, or runs per group
    when unpaired) and spread ``std``; NaN when ``n`` is too small for a test or ``std`` is unknown.

    The MDE is ``std`` times a factor of ``n`` alone (the noncentrality is ``E / std`` times a function of ``n``), so the
    factor is solved once per ``n`` and cached.
    """
    _check_power_arguments(power, level)
    if (n - 1 if paired else 2 * n - 2) < 1 or not np.isfinite(std):
        return np.nan
    return float(std) * _standardised_mde(int(n), float(power), float(level), bool(paired))


@functools.lru_cache(maxsize=4096)
def _standardised_mde(n: int, power: float, level: float, paired: bool) -> float:
    """The MDE at ``std = 1``: the root of ``t_power(E, 1, n) = power``."""
    upper = 1.0
    while t_power(upper, 1.0, n, level=level, paired=paired) < power:  # power grows with the effect: bracket it
        upper *= 2.0
    return float(optimize.brentq(lambda e: t_power(e, 1.0, n, level=level, paired=paired) - power, 0.0, upper,
                                 xtol=1e-12, rtol=1e-10))


def seeds_needed(
    std: float, effect: float, *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL, paired: bool = True,
    max_seeds: int = 100_000,
) -> int | None:
    """Smallest number of seeds (pairs, or runs per group when unpaired) at which a true difference ``effect`` is
    detected with probability ``power`` given the spread ``std`` (e.g. of a pilot's paired differences); None when even
    ``max_seeds`` is not enough."""
    _check_power_arguments(power, level)
    if not np.isfinite(std) or std < 0:
        raise ValueError(f"std={std!r} must be a finite non-negative spread (of a pilot with >= 2 seeds)")
    if not np.isfinite(effect) or effect == 0:
        raise ValueError(f"effect={effect!r} must be a finite non-zero difference to detect")
    if t_power(effect, std, 2, level=level, paired=paired) >= power:
        return 2
    if t_power(effect, std, max_seeds, level=level, paired=paired) < power:
        return None
    low, high = 2, max_seeds  # power(low) < power <= power(high); power grows with n
    while high - low > 1:
        middle = (low + high) // 2
        if t_power(effect, std, middle, level=level, paired=paired) >= power:
            high = middle
        else:
            low = middle
    return high


def stein_seeds_needed(
    pilot_std: float, pilot_size: int, effect: float, *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL,
) -> int:
    """Seeds for Stein's two-stage test (:func:`stein_two_stage`) to detect ``effect`` with probability ``power``:
    ``max(pilot_size, ceil(((t_{1-a/2, n0-1} + t_{power, n0-1}) s_0 / effect)^2))`` (Stein 1945), ``s_0`` the spread of
    the pilot's ``n0`` paired differences. A small pilot pays for its uncertain spread with its t quantiles."""
    _check_power_arguments(power, level)
    if pilot_size < 2 or not np.isfinite(pilot_std) or pilot_std < 0:
        raise ValueError(f"pilot_std={pilot_std!r}, pilot_size={pilot_size!r}: a pilot needs >= 2 paired seeds")
    if not np.isfinite(effect) or effect == 0:
        raise ValueError(f"effect={effect!r} must be a finite non-zero difference to detect")
    factor = stats.t.ppf(1.0 - level / 2.0, pilot_size - 1) + stats.t.ppf(power, pilot_size - 1)
    return max(int(pilot_size), int(math.ceil((factor * pilot_std / abs(effect)) ** 2)))


def stein_mde(pilot_std: float, pilot_size: int, n: int, *, power: float = DEFAULT_POWER,
              level: float = DEFAULT_LEVEL) -> float:
    """The effect Stein's test detects with probability ``power`` at ``n`` seeds: ``(t_{1-a/2} + t_power) s_0 / sqrt(n)``
    on ``n0 - 1`` degrees of freedom."""
    _check_power_arguments(power, level)
    factor = stats.t.ppf(1.0 - level / 2.0, pilot_size - 1) + stats.t.ppf(power, pilot_size - 1)
    return float(factor * pilot_std / np.sqrt(n))


def stein_two_stage(
    differences: Any, pilot_size: int, confidence: float = DEFAULT_CONFIDENCE
) -> dict[str, float]:
    """Stein's (1945) two-stage test of seed-paired ``differences`` whose count was planned from the first
    ``pilot_size`` of them: ``T = sqrt(n) mean(d) / s_0`` (``s_0`` the pilot's spread) follows ``t_{n0-1}`` when there is
    no difference, whatever ``n`` the plan chose, so its level is exact (the ordinary paired t over all seeds is not:
    its spread and ``n`` both depend on the pilot). Returns ``n, mean_difference, pilot_std, ci_low, ci_high,
    p_value``."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if pilot_size < 2 or d.size < pilot_size:
        raise ValueError(f"pilot_size={pilot_size!r} with {d.size} differences: need >= 2 pilot seeds, all present")
    pilot_std = float(d[:pilot_size].std(ddof=1))
    mean = float(d.mean())
    result = _t_result(mean, pilot_std / np.sqrt(d.size), pilot_size - 1, confidence)
    return {"n": int(d.size), "mean_difference": mean, "pilot_std": pilot_std, **result}


def _bca_statistic_iqm(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    return stats.trim_mean(sample, 0.25, axis=axis)


def _bca_statistic_improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    greater = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    ties = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * ties


def bca_interval(
    samples: Sequence[Any],
    statistic: Statistic,
    *,
    paired: bool = False,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = DEFAULT_BOOTSTRAP,
    random_state: RandomState = None,
) -> tuple[Any, Any]:
    """BCa interval of ``statistic(*samples, axis=-1)`` by ``scipy.stats.bootstrap``, along each sample's last axis.

    1-D samples give two floats; samples with leading batch dimensions (``(..., n)``) give two arrays, one interval
    per batch element. NaN below :data:`MIN_BOOTSTRAP_N` values (where it undercovers); a zero-width interval for a
    1-D sample whose statistic cannot vary (every value equal).
    """
    _check_confidence(confidence)
    arrays = [np.asarray(sample, dtype=np.float64) for sample in samples]
    batch_shape = arrays[0].shape[:-1]
    if min(array.shape[-1] for array in arrays) < MIN_BOOTSTRAP_N:
        return (np.nan, np.nan) if not batch_shape else (np.full(batch_shape, np.nan), np.full(batch_shape, np.nan))
    if not batch_shape and all(np.ptp(array) == 0 for array in arrays):
        value = float(statistic(*arrays, axis=-1))
        return value, value
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        # a batch row whose values are all equal makes BCa degenerate; _batched_bca gives it its zero-width interval
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(arrays, statistic, paired=paired, vectorized=True, axis=-1, method="BCa",
                                 confidence_level=confidence, n_resamples=n_bootstrap,
                                 rng=np.random.default_rng(random_state))
    low, high = result.confidence_interval
    return (float(low), float(high)) if not batch_shape else (np.asarray(low), np.asarray(high))


def _batched_bca(
    samples: Sequence[Sequence[np.ndarray]], statistic: Statistic, *, paired: bool, confidence: float,
    n_bootstrap: int, rng: np.random.Generator,
) -> list[tuple[float, float]]:
    """:func:`bca_interval` of each entry of ``samples`` (a tuple of 1-D arrays each), with one vectorised bootstrap
    per distinct sample size (so a table of many groups costs a few scipy calls, not one per group)."""
    intervals: list[tuple[float, float]] = [(np.nan, np.nan)] * len(samples)
    by_size: dict[tuple[int, ...], list[int]] = {}
    for index, arrays in enumerate(samples):
        by_size.setdefault(tuple(array.size for array in arrays), []).append(index)
    for sizes, indices in sorted(by_size.items()):
        if min(sizes) < MIN_BOOTSTRAP_N:
            continue
        stacked = [np.stack([samples[i][k] for i in indices]) for k in range(len(sizes))]
        low, high = bca_interval(stacked, statistic, paired=paired, confidence=confidence, n_bootstrap=n_bootstrap,
                                 random_state=rng)
        constant = np.all([np.ptp(array, axis=-1) == 0 for array in stacked], axis=0)
        value = statistic(*stacked, axis=-1)
        low, high = np.where(constant, value, low), np.where(constant, value, high)  # BCa is undefined there
        for position, index in enumerate(indices):
            intervals[index] = (float(low[position]), float(high[position]))
    return intervals


def variance_split(p: float, variance: float, val_items: float) -> dict[str, float]:
    """Split a group's between-seed variance of a mean accuracy ``p`` into binomial evaluation noise
    ``p(1-p)/val_items`` and training noise ``max(0, variance - evaluation)``; ``eval_share`` = evaluation/variance."""
    evaluation = p * (1.0 - p) / val_items if val_items and np.isfinite(val_items) else np.nan
    training = max(0.0, variance - evaluation) if np.isfinite(variance) and np.isfinite(evaluation) else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        share = evaluation / variance if np.isfinite(variance) and variance > 0 else np.nan
    return {"eval_variance": evaluation, "training_variance": training, "eval_share": share}


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


def _rowwise_iqm_interval(block: np.ndarray, confidence: float,
                          center: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tukey-McLaughlin interval (module doc) of the IQM of each row of ``(rows, n)`` ignoring NaN: ``(low, high)``
    each ``(rows,)``, NaN where fewer than 2 values are kept after trimming. ``center``: the rows' IQMs when the
    caller has them (:func:`_rowwise_interquartile_mean`)."""
    finite = np.isfinite(block)
    count = finite.sum(axis=1)
    ordered = np.sort(np.where(finite, block, np.inf), axis=1)  # finite values first, in order
    cut = np.floor(0.25 * count).astype(np.int64)
    kept = count - 2 * cut
    rows = np.arange(block.shape[0])
    position = np.arange(block.shape[1])[None, :]
    lowest_kept = ordered[rows, np.minimum(cut, block.shape[1] - 1)][:, None]
    highest_kept = ordered[rows, np.clip(count - cut - 1, 0, block.shape[1] - 1)][:, None]
    # winsorise: the cut values at each end take the value of the nearest kept one
    winsorised = np.where(position < cut[:, None], lowest_kept,
                          np.where(position >= (count - cut)[:, None], highest_kept, ordered))
    present = position < count[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        winsorised_mean = np.where(present, winsorised, 0.0).sum(axis=1) / count
        squares = np.where(present, (winsorised - winsorised_mean[:, None]) ** 2, 0.0).sum(axis=1)
        standard_error = np.sqrt(squares / (kept * (kept - 1.0)))
    half = _t_quantiles(confidence, kept - 1) * np.where(kept >= 2, standard_error, np.nan)
    center = _rowwise_interquartile_mean(block) if center is None else center
    return center - half, center + half


def iqm_t_interval(values: Any, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Tukey-McLaughlin interval of the IQM of the finite ``values`` (module doc); the Student-t interval of the mean
    below 4 values (nothing is trimmed); NaN at n < 2."""
    _check_confidence(confidence)
    sample = _finite(values)
    low, high = _rowwise_iqm_interval(sample[None, :], confidence) if sample.size else ([np.nan], [np.nan])
    return float(low[0]), float(high[0])


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
    """Per group and grid step: ``n, mean, std, iqm``, the Student-t interval of the mean and the Tukey-McLaughlin
    interval of the IQM over runs (rliable's sample-efficiency curves, with intervals that cover at a few seeds).

    Returns one row per (group, step) where at least one run of the group covers the step, columns
    ``[*group_keys, step, n, mean, std, iqm, ci_low, ci_high, iqm_ci_low, iqm_ci_high]``; ``ci_*`` is
    ``mean +- t_{(1+c)/2, n-1} std / sqrt(n)`` with the step's own ``n`` (NaN where n < 2), ``iqm_ci_*`` the
    trimmed-mean t interval of the module doc (equal to ``ci_*`` below 4 runs, where the IQM trims nothing).
    ``n_bootstrap`` and ``random_state`` are accepted for compatibility and unused: the bands need no resampling.
    """
    _check_confidence(confidence)
    aligned = align_curves(long, metric, step_grid, [k for k in group_keys if k not in IDENTITY_COLUMNS])
    columns = aligned.columns.to_frame(index=False)
    _check_columns(columns, group_keys, "group_keys")
    matrix = aligned.to_numpy()
    grid = aligned.index.to_numpy()
    del n_bootstrap, random_state  # kept in the signature for existing callers
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
        with np.errstate(invalid="ignore", divide="ignore"):
            half = stats.t.ppf(0.5 + confidence / 2.0, count - 1) * np.sqrt(variance / count)
        low, high = mean - half, mean + half
        values = group if isinstance(group, tuple) else (group,)
        frame = pd.DataFrame({key: [value] * int(rows.sum()) for key, value in zip(group_keys, values, strict=True)})
        frame["step"] = grid[rows]
        frame["n"] = count
        frame["mean"] = mean
        frame["std"] = np.where(count > 1, np.sqrt(variance), np.nan)
        frame["iqm"] = _rowwise_interquartile_mean(block)
        frame["ci_low"] = low
        frame["ci_high"] = high
        frame["iqm_ci_low"], frame["iqm_ci_high"] = _rowwise_iqm_interval(block, confidence,
                                                                          frame["iqm"].to_numpy())
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*group_keys, "step", "n", "mean", "std", "iqm", "ci_low", "ci_high",
                                     "iqm_ci_low", "iqm_ci_high"])
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

    summary = identity
    summary["n_points"] = ends - starts
    summary["first_step"] = steps[starts]
    summary["last_step"] = steps[ends - 1]
    summary["final"] = values[ends - 1]
    summary["final_window"] = _window_means(values, starts, ends, final_window)
    summary["auc"] = _normalised_areas(steps, values, starts, ends)
    summary["best"] = np.where(minimise, np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts))
    summary["steps_to_threshold"] = _steps_to_threshold(steps, values, starts, ends, segment_metrics, minimise,
                                                        thresholds)
    return summary


def _window_means(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, final_window: int) -> np.ndarray:
    """Mean of the last ``final_window`` values of each segment ``values[start:end]`` (all of a shorter one)."""
    window_starts = np.maximum(starts, ends - final_window)
    # reduceat over interleaved (window start, end) pairs sums each window; a trailing 0 makes `end == len` valid.
    padded = np.append(values, 0.0)
    window_sums = np.add.reduceat(padded, np.column_stack([window_starts, ends]).ravel())[::2]
    return window_sums / (ends - window_starts)


def _normalised_areas(steps: np.ndarray, values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Trapezoid area under each segment divided by its step span (the single value of a one-step segment)."""
    # Trapezoids between consecutive rows, zeroed where the next row starts another segment.
    trapezoids = np.zeros_like(values)
    trapezoids[:-1] = 0.5 * (values[1:] + values[:-1]) * np.diff(steps).astype(np.float64)
    trapezoids[ends - 1] = 0.0
    areas = np.add.reduceat(trapezoids, starts)
    span = (steps[ends - 1] - steps[starts]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(span > 0, areas / span, values[starts])


def _steps_to_threshold(steps: np.ndarray, values: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                        segment_metrics: np.ndarray, minimise: np.ndarray,
                        thresholds: Mapping[str, float] | None) -> np.ndarray:
    """First step at which each segment reaches its metric's threshold (``<=`` when lower is better), else NaN."""
    reached_step = np.full(starts.size, np.nan)
    if not thresholds:
        return reached_step
    count = ends - starts
    segment_threshold = np.array([thresholds.get(m, np.nan) for m in segment_metrics], dtype=np.float64)
    row_threshold = np.repeat(segment_threshold, count)
    row_minimise = np.repeat(minimise, count)
    reached = np.where(row_minimise, values <= row_threshold, values >= row_threshold)
    first = np.minimum.reduceat(np.where(reached, np.arange(values.size), values.size), starts)
    hit = first < ends
    reached_step[hit] = steps[first[hit]]
    return reached_step


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
    runs with a finite value, ``std`` with ``ddof=1``, ``ci_*`` the Student-t interval of the mean (NaN at n < 2),
    ``iqm_ci_*`` a BCa bootstrap interval of the IQM (NaN below :data:`MIN_BOOTSTRAP_N` runs). ``stratify_by``
    (several sweeps pooled): the IQM interval resamples each stratum to its own size (percentile interval).
    """
    _check_columns(summaries, [*group_keys, *stratify_by, "metric", value], "group_keys/stratify_by/value")
    _check_confidence(confidence)
    rng = np.random.default_rng(random_state)
    values = summaries[value].to_numpy(dtype=np.float64)
    finite = np.isfinite(values)
    records: list[dict[str, Any]] = []
    bootstrapped: list[tuple[int, np.ndarray]] = []  # (record index, sample) of the IQM intervals to draw
    for key, positions in _group_items(summaries, [*group_keys, "metric"]):
        positions = positions[finite[positions]]
        record: dict[str, Any] = dict(zip([*group_keys, "metric"], key, strict=True))
        sample = values[positions]
        record["n"] = int(sample.size)
        if not sample.size:
            records.append(record)
            continue
        mean_low, mean_high = t_interval(sample, confidence)
        record.update(mean=float(sample.mean()), std=float(sample.std(ddof=1)) if sample.size > 1 else np.nan,
                      iqm=float(_rowwise_interquartile_mean(sample[None, :])[0]), ci_low=mean_low, ci_high=mean_high,
                      iqm_ci_low=np.nan, iqm_ci_high=np.nan)
        if stratify_by and sample.size >= MIN_BOOTSTRAP_N:
            strata_codes = summaries.iloc[positions].groupby(list(stratify_by), dropna=False, observed=True).indices
            strata = [sample[p] for _, p in sorted(strata_codes.items(), key=lambda item: str(item[0]))]
            record["iqm_ci_low"], record["iqm_ci_high"] = bootstrap_ci(
                strata, interquartile_mean, confidence=confidence, n_bootstrap=n_bootstrap, random_state=rng)
        elif not stratify_by:
            bootstrapped.append((len(records), sample))
        records.append(record)
    intervals = _batched_bca([(sample,) for _, sample in bootstrapped], _bca_statistic_iqm, paired=False,
                             confidence=confidence, n_bootstrap=n_bootstrap, rng=rng)
    for (index, _), (low, high) in zip(bootstrapped, intervals, strict=True):
        records[index]["iqm_ci_low"], records[index]["iqm_ci_high"] = low, high
    columns = [*group_keys, "metric", "n", "mean", "std", "iqm", "ci_low", "ci_high", "iqm_ci_low", "iqm_ci_high"]
    return pd.DataFrame.from_records(records, columns=columns)


def _matches(frame: pd.DataFrame, selector: Mapping[str, Any]) -> np.ndarray:
    """Rows whose columns equal every ``selector`` item (floats compared with ``np.isclose``)."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in selector.items():
        column_values = frame[column]
        if pd.api.types.is_float_dtype(column_values.dtype) and isinstance(wanted, (int, float)):
            # NaN selects the runs a factor does not apply to (eta of a preset without eta)
            mask &= np.isclose(column_values.to_numpy(dtype=np.float64), float(wanted), equal_nan=True)
        else:
            mask &= (column_values.astype(str) == str(wanted)).to_numpy(dtype=bool)
    return mask


DIFFERENCE_COLUMNS: tuple[str, ...] = (
    "n_pairs", "mean", "baseline_mean", "mean_difference", "std_difference", "ci_low", "ci_high", "p_value",
    "p_holm", "mde", "prob_improvement", "prob_ci_low", "prob_ci_high", "method")


def _compare(
    x: np.ndarray, y: np.ndarray, sign: float, *, paired: bool, confidence: float, power: float, level: float,
) -> dict[str, Any]:
    """One comparison's numbers (see :func:`paired_differences`); ``x``, ``y`` paired by position when ``paired``."""
    test = paired_t(x, y, confidence) if paired else welch_t(x, y, confidence)
    n = int(x.size) if paired else int(min(x.size, y.size))
    record: dict[str, Any] = {
        "n_pairs": n, "mean": float(x.mean()), "baseline_mean": float(y.mean()),
        "mean_difference": test["mean_difference"], "std_difference": test["std_difference"],
        "ci_low": test["ci_low"], "ci_high": test["ci_high"], "p_value": test["p_value"],
        "mde": minimum_detectable_effect(test["std_difference"], n, power=power, level=level, paired=paired),
        "prob_improvement": probability_of_improvement(sign * x, sign * y),
        "method": "paired t" if paired else "Welch t",
    }
    record["prob_ci_low"], record["prob_ci_high"] = np.nan, np.nan  # drawn for all groups at once by the caller
    return record


def _metric_samples(
    of_metric: pd.DataFrame, metric: str, value: str, group_keys: Sequence[str], baseline_key: tuple[Any, ...],
    pair_on: Sequence[str], paired: bool,
) -> list[tuple[tuple[Any, ...], np.ndarray, np.ndarray]]:
    """``(group key, x, y)`` for every group but the baseline: paired, the values of the ``pair_on`` keys present in
    both (in the group's order; a repeated key keeps its last run); unpaired, all values of each group."""
    reference_positions = np.flatnonzero(_matches(of_metric, dict(zip(group_keys, baseline_key, strict=True))))
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
    for key, positions in _group_items(of_metric, group_keys):
        if tuple(str(k) for k in key) == tuple(str(k) for k in baseline_key):
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


def _baseline_strata(
    summaries: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any]
) -> tuple[list[str], dict[tuple[str, ...], tuple[Any, ...]]]:
    """``(stratum keys, {stratum values as text: baseline group key})``.

    The stratum keys are the group keys outside ``baseline`` on which the baseline runs differ (``trainer.lr`` when
    ``baseline={"alpha": 0}`` selects alpha = 0 at each learning rate): each group is compared with the baseline
    group of its own stratum. None such: one stratum, and ``baseline`` must select exactly one group.
    """
    baseline_groups = summaries.loc[_matches(summaries, baseline), list(group_keys)].drop_duplicates()
    strata_keys = [key for key in group_keys
                   if key not in baseline and baseline_groups[key].nunique(dropna=False) > 1]
    if len(baseline_groups) == 0 or (not strata_keys and len(baseline_groups) != 1):
        found = baseline_groups.to_dict("records")
        raise ValueError(f"baseline={baseline!r} selects {len(found)} groups of group_keys={list(group_keys)!r} "
                         f"({found[:5]}); it must select exactly one (add keys to the baseline)")
    positions = [list(group_keys).index(key) for key in strata_keys]
    baseline_keys: dict[tuple[str, ...], tuple[Any, ...]] = {}
    for row in baseline_groups.itertuples(index=False):
        stratum = tuple(str(row[i]) for i in positions)
        if stratum in baseline_keys:
            raise ValueError(f"baseline={baseline!r} selects two groups with {dict(zip(strata_keys, stratum))}: "
                             f"{baseline_keys[stratum]} and {tuple(row)}; add keys to the baseline")
        baseline_keys[stratum] = tuple(row)
    return strata_keys, baseline_keys


def _stratified_samples(
    of_metric: pd.DataFrame, metric: str, value: str, group_keys: Sequence[str],
    strata: tuple[list[str], dict[tuple[str, ...], tuple[Any, ...]]], pair_on: Sequence[str], paired: bool,
) -> list[tuple[tuple[Any, ...], np.ndarray, np.ndarray]]:
    """:func:`_metric_samples` within each stratum (the other factors' values) against that stratum's baseline; a
    group whose stratum has no baseline run gets empty samples (``n_pairs = 0``)."""
    strata_keys, baseline_keys = strata
    if not strata_keys:
        (baseline_key,) = baseline_keys.values()
        return _metric_samples(of_metric, metric, value, group_keys, baseline_key, pair_on, paired)
    samples = []
    for stratum, positions in _group_items(of_metric, strata_keys):
        subset = of_metric.iloc[positions]
        baseline_key = baseline_keys.get(tuple(str(part) for part in stratum))
        if baseline_key is None or not _matches(subset, dict(zip(group_keys, baseline_key, strict=True))).any():
            empty = np.empty(0, dtype=np.float64)
            samples += [(key, empty, empty) for key, _ in _group_items(subset, group_keys)]
            continue
        samples += _metric_samples(subset, metric, value, group_keys, baseline_key, pair_on, paired)
    return samples


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
    paired: bool = True,
    power: float = DEFAULT_POWER,
    level: float = DEFAULT_LEVEL,
) -> pd.DataFrame:
    """Per (group, metric) against the baseline group, pairing runs on ``pair_on`` (the seed).

    ``baseline``: column values selecting the baseline group, default ``{"alpha": 0.0}``. It selects one group of
    ``group_keys``, or one per combination of the other factors: with ``group_keys=("alpha", "trainer.lr")`` and
    ``baseline={"alpha": 0}``, each (alpha, lr) is compared with alpha = 0 at the same lr, paired on seed. Returns ``[*group_keys, metric, *DIFFERENCE_COLUMNS]`` for every other group (definitions
    in the module doc): ``mean_difference`` with its paired-t interval ``ci_low``/``ci_high`` and p-value, ``p_holm``
    (Holm over the groups of one metric), ``std_difference`` (of the paired differences), ``mde`` (80% power, 5%
    two-sided by default), ``prob_improvement`` with a paired BCa interval (NaN below :data:`MIN_BOOTSTRAP_N` pairs).
    ``paired=False``: Welch's t on all runs of the two groups (``n_pairs`` = the smaller group's size). Groups with no
    seed in common get ``n_pairs = 0`` and NaN.
    """
    baseline = dict(baseline if baseline is not None else {"alpha": 0.0})
    _check_columns(summaries, [*group_keys, *pair_on, *baseline, "metric", value], "group_keys/pair_on/baseline/value")
    _check_confidence(confidence)
    _check_power_arguments(power, level)
    strata = _baseline_strata(summaries, group_keys, baseline)
    rng = np.random.default_rng(random_state)
    records: list[dict[str, Any]] = []
    bootstrapped: list[tuple[int, tuple[np.ndarray, np.ndarray]]] = []  # (record index, samples) of P's intervals
    for metric in sorted(summaries["metric"].astype(str).unique()):
        of_metric = summaries[(summaries["metric"].astype(str) == metric).to_numpy() & np.isfinite(
            summaries[value].to_numpy(dtype=np.float64))]
        sign = -1.0 if lower_is_better(metric, minimize) else 1.0
        metric_records = []
        for key, x, y in _stratified_samples(of_metric, metric, value, group_keys, strata, pair_on, paired):
            record: dict[str, Any] = {**dict(zip(group_keys, key, strict=True)), "metric": metric, "n_pairs": 0,
                                      "method": "paired t" if paired else "Welch t"}
            if x.size and y.size:
                record.update(_compare(x, y, sign, paired=paired, confidence=confidence, power=power, level=level))
                bootstrapped.append((len(records) + len(metric_records), (sign * x, sign * y)))
            metric_records.append(record)
        adjusted = holm_adjust([r.get("p_value", np.nan) for r in metric_records])
        for record, p_holm in zip(metric_records, adjusted, strict=True):
            record["p_holm"] = p_holm
        records.extend(metric_records)
    intervals = _batched_bca([pair for _, pair in bootstrapped], _bca_statistic_improvement, paired=paired,
                             confidence=confidence, n_bootstrap=n_bootstrap, rng=rng)
    for (index, _), (low, high) in zip(bootstrapped, intervals, strict=True):
        records[index]["prob_ci_low"], records[index]["prob_ci_high"] = low, high
    return pd.DataFrame.from_records(records, columns=[*group_keys, "metric", *DIFFERENCE_COLUMNS])


# --- defaults for a sweep ----------------------------------------------------------------------------------------


def default_group_keys(runs: pd.DataFrame) -> tuple[str, ...]:
    """The swept non-seed factors of a run table: ``mechanism_label`` when the runs hold more than one mechanism
    configuration, ``alpha``, then every other factor column (``eta``, ``trainer.lr``, ...) taking more than one
    value (:func:`analysis.load.factor_columns`)."""
    labels = runs["mechanism_label"].dropna().unique() if "mechanism_label" in runs.columns else []
    summary_columns = ("n_points", "first_step", "last_step", *SUMMARY_STATISTICS)
    factors = tuple(column for column in factor_columns(runs, exclude=summary_columns)
                    if runs[column].nunique(dropna=False) > 1)
    return (*(("mechanism_label",) if len(labels) > 1 else ()), "alpha", *factors)


def default_baseline(frame: pd.DataFrame, group_keys: Sequence[str]) -> dict[str, Any] | None:
    """The baseline selector for :func:`paired_differences`, or None when none is unambiguous.

    With mechanism labels: the ``baseline`` label if present; otherwise (or without labels) ``alpha == 0``. The full
    group key when that selects one group; the selector alone when it selects one group per value of the other
    factors (``trainer.lr``: deltas against alpha = 0 at the same lr); never across mechanism configurations.
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
        fixed = [key for key in ("mechanism_label", "alpha") if key in group_keys]
        if len(selected) > 1 and len(selected[fixed].drop_duplicates()) == 1:
            return {**selector, **{key: selected.iloc[0][key] for key in fixed}}
    return None
