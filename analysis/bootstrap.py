"""Bootstrap intervals over seeds (stratified percentile, batched BCa), for the IQM and the probability of
improvement only: means and differences get t intervals, the bootstrap undercovers at a few seeds."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from analysis.statistics import DEFAULT_CONFIDENCE, RandomState, Statistic, check_confidence, indices_by_size

DEFAULT_BOOTSTRAP = 2000
MIN_BOOTSTRAP_N = 8


def stratified_bootstrap(strata: Sequence[Any], statistic: Statistic = np.mean, *, n_bootstrap: int = DEFAULT_BOOTSTRAP,
                         random_state: RandomState = None) -> np.ndarray:
    """Bootstrap distribution of ``statistic(array, axis=1)``, each of ``strata`` resampled to its own size (a flat
    sequence of numbers is one stratum)."""
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap={n_bootstrap!r} must be a positive integer")
    if all(np.ndim(element) == 0 for element in strata):
        strata = [np.asarray(strata, dtype=np.float64)]
    samples = [s for s in (np.asarray(stratum, dtype=np.float64).ravel() for stratum in strata) if s.size]
    if not samples:
        raise ValueError("stratified_bootstrap needs at least one non-empty stratum")
    rng = np.random.default_rng(random_state)
    resampled = np.concatenate(
        [s[rng.integers(0, s.size, size=(n_bootstrap, s.size))] for s in samples], axis=1)
    return np.asarray(statistic(resampled, axis=1), dtype=np.float64)


def bootstrap_ci(strata: Sequence[Any], statistic: Statistic = np.mean, *, confidence: float = DEFAULT_CONFIDENCE,
                 n_bootstrap: int = DEFAULT_BOOTSTRAP, random_state: RandomState = None) -> tuple[float, float]:
    """Percentile ``confidence`` interval of ``statistic`` under the stratified bootstrap (not for means)."""
    check_confidence(confidence)
    distribution = stratified_bootstrap(strata, statistic, n_bootstrap=n_bootstrap, random_state=random_state)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(distribution, [tail, 1.0 - tail])
    return float(low), float(high)


def bca_interval(samples: Sequence[Any], statistic: Statistic, *, paired: bool = False,
                 confidence: float = DEFAULT_CONFIDENCE, n_bootstrap: int = DEFAULT_BOOTSTRAP,
                 random_state: RandomState = None) -> tuple[Any, Any]:
    """BCa interval of ``statistic(*samples, axis=-1)`` by ``scipy.stats.bootstrap`` (NaN below
    :data:`MIN_BOOTSTRAP_N` values, where it undercovers); floats for 1-D samples, arrays for a batch."""
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


def bca_intervals(samples: Sequence[Sequence[np.ndarray]], statistic: Statistic, *, paired: bool, confidence: float,
                  n_bootstrap: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """:func:`bca_interval` of each entry of ``samples``, one vectorised bootstrap per distinct sample size."""
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
