"""Bootstrap intervals over seeds: the stratified percentile bootstrap and batched BCa intervals.

- **Stratified bootstrap** (:func:`stratified_bootstrap`): each stratum (e.g. one sweep of several pooled) is
  resampled with replacement to its own size; scipy's bootstrap does not stratify.
- **BCa** (:func:`bca_interval`): ``scipy.stats.bootstrap(method="BCa")``, for the IQM and the probability of
  improvement in the per-group tables, refused below :data:`MIN_BOOTSTRAP_N` values (NaN), where it undercovers:
  simulated coverage of a nominal 95% BCa interval of the IQM of normal data is 0.89 at n = 5 and 0.93 at n = 8 to 20
  (``tests/analysis/test_analysis_coverage.py``). :func:`bca_intervals` draws one vectorised bootstrap per distinct
  sample size for a whole table.

Neither is used for means and differences of means: over a few seeds the percentile bootstrap undercovers badly (about
49% at n = 2, 75% at n = 3, 89% at n = 10 for a nominal 95%); those get the t intervals of :mod:`analysis.statistics`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from analysis.statistics import (
    DEFAULT_CONFIDENCE,
    RandomState,
    Statistic,
    check_confidence,
    indices_by_size,
    interquartile_mean,
)

DEFAULT_BOOTSTRAP = 2000
MIN_BOOTSTRAP_N = 8


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
    check_confidence(confidence)
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
    """Percentile ``confidence`` interval of ``statistic`` under the stratified bootstrap (module doc: not for
    means)."""
    distribution = stratified_bootstrap(strata, statistic, n_bootstrap=n_bootstrap, random_state=random_state)
    return percentile_interval(distribution, confidence)


def iqm_statistic(sample: np.ndarray, axis: int = -1) -> np.ndarray:
    """The IQM along ``axis``, in the form :func:`bca_interval` takes."""
    return interquartile_mean(sample, axis=axis)


def improvement_statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`analysis.statistics.probability_of_improvement` of ``x`` over ``y`` along ``axis``, batched over the
    other axes (the form :func:`bca_interval` takes)."""
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
    check_confidence(confidence)
    arrays = [np.asarray(sample, dtype=np.float64) for sample in samples]
    batch_shape = arrays[0].shape[:-1]
    if min(array.shape[-1] for array in arrays) < MIN_BOOTSTRAP_N:
        return (np.nan, np.nan) if not batch_shape else (np.full(batch_shape, np.nan), np.full(batch_shape, np.nan))
    if not batch_shape and all(np.ptp(array) == 0 for array in arrays):
        value = float(statistic(*arrays, axis=-1))
        return value, value
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        # a batch row whose values are all equal makes BCa degenerate; bca_intervals gives it its zero-width interval
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(arrays, statistic, paired=paired, vectorized=True, axis=-1, method="BCa",
                                 confidence_level=confidence, n_resamples=n_bootstrap,
                                 rng=np.random.default_rng(random_state))
    low, high = result.confidence_interval
    return (float(low), float(high)) if not batch_shape else (np.asarray(low), np.asarray(high))


def bca_intervals(
    samples: Sequence[Sequence[np.ndarray]], statistic: Statistic, *, paired: bool, confidence: float,
    n_bootstrap: int, rng: np.random.Generator,
) -> list[tuple[float, float]]:
    """:func:`bca_interval` of each entry of ``samples`` (a tuple of 1-D arrays each), with one vectorised bootstrap
    per distinct sample size (so a table of many groups costs a few scipy calls, not one per group)."""
    intervals: list[tuple[float, float]] = [(np.nan, np.nan)] * len(samples)
    for sizes, indices in indices_by_size(samples):
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
