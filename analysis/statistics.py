"""Statistics of seeds on plain arrays: t intervals and tests, Holm, power, MDE, seeds needed, IQM and its interval.

Definitions: docs/analysis.md ("Definitions").
"""

from __future__ import annotations

import bisect
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy import optimize, stats
from statsmodels.stats.power import TTestIndPower, TTestPower

DEFAULT_CONFIDENCE = 0.95
DEFAULT_POWER = 0.8
DEFAULT_LEVEL = 0.05  # two-sided test level of p-values, the MDE and seeds needed
# Reports print no interval below this many seeds (a t interval at n = 2 is exact but uselessly wide: t_0.975,1 = 12.7)
MIN_SEEDS_FOR_INTERVAL = 3

RandomState = int | np.random.Generator | None
Statistic = Callable[..., np.ndarray]
_PAIRED_POWER, _UNPAIRED_POWER = TTestPower(), TTestIndPower()


def check_confidence(confidence: Any) -> None:
    if not np.all((np.asarray(confidence) > 0.0) & (np.asarray(confidence) < 1.0)):
        raise ValueError(f"confidence={confidence!r} must lie strictly between 0 and 1 (e.g. 0.95)")


def check_power_arguments(power: float, level: float, effect: float | None = None) -> None:
    for name, value, example in (("power", power, 0.8), ("level", level, 0.05)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value!r} must lie strictly between 0 and 1 (e.g. {example})")
    if effect is not None and (not np.isfinite(effect) or effect == 0):
        raise ValueError(f"effect={effect!r} must be a finite non-zero difference to detect")


def finite_values(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    return array[np.isfinite(array)]


def indices_by_size(samples: Sequence[Sequence[np.ndarray]]) -> list[tuple[tuple[int, ...], list[int]]]:
    """``(sizes, indices)`` per distinct tuple of sample sizes: the entries one vectorised call can take stacked."""
    by_size: dict[tuple[int, ...], list[int]] = {}
    for index, arrays in enumerate(samples):
        by_size.setdefault(tuple(array.size for array in arrays), []).append(index)
    return sorted(by_size.items())


def _as_floats(result: dict[str, Any]) -> dict[str, Any]:
    return {key: float(value) if np.ndim(value) == 0 else value for key, value in result.items()}


def t_bounds(center: Any, standard_error: Any, df: Any, confidence: Any = DEFAULT_CONFIDENCE
             ) -> tuple[np.ndarray, np.ndarray]:
    """``center +- t_{(1+c)/2, df} standard_error``, broadcast; NaN where ``df <= 0`` or the error is not finite."""
    check_confidence(confidence)
    center, standard_error, df, confidence = np.broadcast_arrays(
        *(np.asarray(argument, dtype=np.float64) for argument in (center, standard_error, df, confidence)))
    valid = np.isfinite(standard_error) & (standard_error >= 0) & (df > 0)
    low, high = np.where(valid, center, np.nan), np.where(valid, center, np.nan)
    spread = valid & (standard_error > 0)
    if spread.any():
        low[spread], high[spread] = stats.t.interval(confidence[spread], df[spread], loc=center[spread],
                                                     scale=standard_error[spread])
    return low, high


def _scipy_t(test: Callable[..., Any], x: np.ndarray, y: np.ndarray, confidence: float, **options: Any) -> Any:
    """``test(x, y)`` along the last axis and its interval, without scipy's "precision loss" warning for constant
    samples."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = test(x, y, axis=-1, **options)
        return result, result.confidence_interval(confidence)


def paired_t(x: Any, y: Any, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """Paired t (``scipy.stats.ttest_rel``) along the last axis: floats for ``(n,)`` samples, arrays for a batch."""
    check_confidence(confidence)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim == 0:
        raise ValueError(f"paired_t needs samples of equal shape (pairs), got {x.shape} and {y.shape}")
    n, differences, nan = x.shape[-1], x - y, np.full(x.shape[:-1], np.nan)
    if n < 2:
        return _as_floats({"n": n, "mean_difference": differences.mean(axis=-1) if n else nan, "std_difference": nan,
                           "ci_low": nan, "ci_high": nan, "p_value": nan})
    mean, std = differences.mean(axis=-1), differences.std(axis=-1, ddof=1)
    test, (low, high) = _scipy_t(stats.ttest_rel, x, y, confidence)
    return _as_floats({"n": n, "mean_difference": mean, "std_difference": std, "ci_low": low, "ci_high": high,
                       "p_value": np.where((std == 0) & (mean == 0), 1.0, test.pvalue)})


def welch_t(x: Any, y: Any, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """Welch's t along the last axis; ``std_difference`` is the pooled ``sqrt((s_x^2 + s_y^2)/2)`` the MDE uses."""
    check_confidence(confidence)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim == 1 and y.ndim == 1:
        x, y = finite_values(x), finite_values(y)
    n_x, n_y = x.shape[-1], y.shape[-1]
    nan = np.full(np.broadcast_shapes(x.shape[:-1], y.shape[:-1]), np.nan)
    difference = x.mean(axis=-1) - y.mean(axis=-1) if n_x and n_y else nan
    if n_x < 2 or n_y < 2:
        return _as_floats({"mean_difference": difference, "std_difference": nan, "ci_low": nan, "ci_high": nan,
                           "p_value": nan, "df": nan})
    var_x, var_y = x.var(axis=-1, ddof=1), y.var(axis=-1, ddof=1)
    test, (low, high) = _scipy_t(stats.ttest_ind, x, y, confidence, equal_var=False)
    constant = (var_x == 0) & (var_y == 0)  # scipy's Welch df is 0/0 there
    return _as_floats({"mean_difference": difference, "std_difference": np.sqrt((var_x + var_y) / 2.0),
                       "ci_low": low, "ci_high": high,
                       "p_value": np.where(constant & (difference == 0), 1.0, test.pvalue),
                       "df": np.where(constant, float(n_x + n_y - 2), test.df)})


def t_tests(samples: Sequence[tuple[np.ndarray, np.ndarray]], *, paired: bool,
            confidence: float = DEFAULT_CONFIDENCE) -> list[dict[str, float]]:
    """:func:`paired_t` or :func:`welch_t` of each ``(x, y)``, one vectorised call per distinct pair of sizes."""
    results: list[dict[str, float]] = [{} for _ in samples]
    for _, indices in indices_by_size(samples):
        x, y = (np.stack([samples[i][side] for i in indices]) for side in (0, 1))
        batch = paired_t(x, y, confidence) if paired else welch_t(x, y, confidence)
        for position, index in enumerate(indices):
            results[index] = {key: float(np.broadcast_to(value, (len(indices),))[position])
                              for key, value in batch.items()}
    return results


def holm_adjust(p_values: Any) -> np.ndarray:
    """Holm-adjusted p-values in the given order (NaN not counted); statsmodels' values without its gc per call."""
    p = np.asarray(p_values, dtype=np.float64).ravel()
    adjusted = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    scaled = (order.size - np.arange(order.size)) * p[order]  # (m - j + 1) p_(j), j counted from 1
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted


def t_power(effect: float, std: float, n: int, *, level: float = DEFAULT_LEVEL, paired: bool = True) -> float:
    """Power of the two-sided t-test at a true difference ``effect`` (``n`` per group when unpaired)."""
    df = n - 1 if paired else 2 * n - 2
    if df < 1 or not np.isfinite(std) or std < 0:
        return np.nan
    if std == 0:
        return 1.0 if effect != 0 else level
    effect_size = abs(effect) / std
    solver, size = (_PAIRED_POWER, {"nobs": n}) if paired else (_UNPAIRED_POWER, {"nobs1": n, "ratio": 1.0})
    # Two-sided = both one-sided tails at level / 2. statsmodels goes through scipy's nctdtr, which returns NaN far in
    # the tails: the wrong-sign tail (below level / 2, vanishing with the noncentrality) then counts as 0, the right
    # one (near 1 there) comes from scipy's nct.sf, which stays finite.
    right = solver.power(effect_size, alpha=level / 2.0, alternative="larger", **size)
    wrong = solver.power(effect_size, alpha=level / 2.0, alternative="smaller", **size)
    if np.isnan(right):
        noncentrality = effect_size * np.sqrt(n if paired else n / 2.0)
        right = stats.nct.sf(stats.t.isf(level / 2.0, df), df, noncentrality)
    return float(right + np.nan_to_num(wrong, nan=0.0))


def minimum_detectable_effect(std: float, n: int, *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL,
                              paired: bool = True) -> float:
    """Smallest ``|difference|`` the t-test detects with probability ``power`` at ``n`` seeds and spread ``std``."""
    check_power_arguments(power, level)
    if (n - 1 if paired else 2 * n - 2) < 1 or not np.isfinite(std):
        return np.nan
    return float(std) * _standardised_mde(int(n), float(power), float(level), bool(paired))


@functools.lru_cache(maxsize=4096)
def _standardised_mde(n: int, power: float, level: float, paired: bool) -> float:
    """The MDE at ``std = 1`` (Brent, to 1e-12); cached, the MDE scales with ``std``."""
    upper = 1.0
    while t_power(upper, 1.0, n, level=level, paired=paired) < power:  # power grows with the effect: bracket it
        upper *= 2.0
    return float(optimize.brentq(lambda e: t_power(e, 1.0, n, level=level, paired=paired) - power, 0.0, upper,
                                 xtol=1e-12, rtol=1e-10))


def seeds_needed(std: float, effect: float, *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL,
                 paired: bool = True, max_seeds: int = 100_000) -> int | None:
    """Smallest number of seeds detecting ``effect`` with probability ``power`` at spread ``std`` (None past
    ``max_seeds``)."""
    check_power_arguments(power, level, effect)
    if not np.isfinite(std) or std < 0:
        raise ValueError(f"std={std!r} must be a finite non-negative spread (of a pilot with >= 2 seeds)")

    def enough(n: int) -> bool:
        return t_power(effect, std, n, level=level, paired=paired) >= power

    if not enough(max_seeds):
        return None
    return 2 + bisect.bisect_left(range(2, max_seeds + 1), True, key=enough)  # power grows with n


def stein_seeds_needed(pilot_std: float, pilot_size: int, effect: float, *, power: float = DEFAULT_POWER,
                       level: float = DEFAULT_LEVEL) -> int:
    """Seeds for Stein's two-stage test to detect ``effect``: ``max(n0, ceil(((t_{1-a/2} + t_power) s_0 / E)^2))``
    on ``n0 - 1`` degrees of freedom (Stein 1945)."""
    check_power_arguments(power, level, effect)
    if pilot_size < 2 or not np.isfinite(pilot_std) or pilot_std < 0:
        raise ValueError(f"pilot_std={pilot_std!r}, pilot_size={pilot_size!r}: a pilot needs >= 2 paired seeds")
    factor = stats.t.ppf(1.0 - level / 2.0, pilot_size - 1) + stats.t.ppf(power, pilot_size - 1)
    return max(int(pilot_size), int(math.ceil((float(factor * pilot_std) / abs(effect)) ** 2)))


def stein_two_stage(differences: Any, pilot_size: int, confidence: float = DEFAULT_CONFIDENCE) -> dict[str, float]:
    """Stein's (1945) two-stage test of paired ``differences`` planned from the first ``pilot_size``: exact level."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if pilot_size < 2 or d.size < pilot_size:
        raise ValueError(f"pilot_size={pilot_size!r} with {d.size} differences: need >= 2 pilot seeds, all present")
    pilot_std, mean = float(d[:pilot_size].std(ddof=1)), float(d.mean())
    standard_error = pilot_std / np.sqrt(d.size)
    low, high = t_bounds(mean, standard_error, pilot_size - 1, confidence)
    # identical pilot differences: no spread, the sign is certain unless the difference is 0
    p_value = float(2.0 * stats.t.sf(abs(mean) / standard_error, pilot_size - 1)) if standard_error > 0 else float(
        mean == 0)
    return {"n": int(d.size), "mean_difference": mean, "pilot_std": pilot_std, "ci_low": float(low),
            "ci_high": float(high), "p_value": p_value}


def interquartile_mean(values: Any, axis: int | None = None) -> Any:
    """IQM: the mean of the middle 50% of the sorted values."""
    return stats.trim_mean(values, 0.25, axis=axis)


def _sorted_rows(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row of ``(rows, n)`` sorted with its NaN last (as inf), its finite count and the values cut at each end."""
    finite = np.isfinite(block)
    count = finite.sum(axis=1)
    return np.sort(np.where(finite, block, np.inf), axis=1), count, np.floor(0.25 * count).astype(np.int64)


def rowwise_iqm(block: np.ndarray) -> np.ndarray:
    """IQM of each row of ``(rows, n)`` ignoring NaN."""
    ordered, count, cut = _sorted_rows(block)
    cumulative = np.concatenate(
        [np.zeros((block.shape[0], 1)), np.cumsum(np.where(np.isfinite(ordered), ordered, 0.0), axis=1)], axis=1)
    rows, upper = np.arange(block.shape[0]), count - cut
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(upper > cut, (cumulative[rows, upper] - cumulative[rows, cut]) / (upper - cut), np.nan)


def rowwise_iqm_interval(block: np.ndarray, confidence: float,
                         center: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Tukey-McLaughlin interval of the IQM of each row ignoring NaN; ``center``: the rows' IQMs if known."""
    ordered, count, cut = _sorted_rows(block)
    kept, rows, last = count - 2 * cut, np.arange(block.shape[0]), block.shape[1] - 1
    position = np.arange(block.shape[1])[None, :]
    # winsorise: the cut values at each end take the value of the nearest kept one
    winsorised = np.where(position < cut[:, None], ordered[rows, np.minimum(cut, last)][:, None],
                          np.where(position >= (count - cut)[:, None],
                                   ordered[rows, np.clip(count - cut - 1, 0, last)][:, None], ordered))
    present = position < count[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        winsorised_mean = np.where(present, winsorised, 0.0).sum(axis=1) / count
        squares = np.where(present, (winsorised - winsorised_mean[:, None]) ** 2, 0.0).sum(axis=1)
        standard_error = np.sqrt(squares / (kept * (kept - 1.0)))
    center = rowwise_iqm(block) if center is None else center
    return t_bounds(center, np.where(kept >= 2, standard_error, np.nan), kept - 1, confidence)


def iqm_t_interval(values: Any, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Tukey-McLaughlin interval of the IQM of the finite ``values`` (the t interval below 4 values)."""
    check_confidence(confidence)
    sample = finite_values(values)
    low, high = rowwise_iqm_interval(sample[None, :], confidence) if sample.size else ([np.nan], [np.nan])
    return float(low[0]), float(high[0])


def improvement_statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """:func:`probability_of_improvement` along ``axis``, batched over the others."""
    x, y = np.moveaxis(x, axis, -1), np.moveaxis(y, axis, -1)
    greater = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    ties = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return greater + 0.5 * ties


def probability_of_improvement(x: Any, y: Any) -> float:
    """``P(X > Y)`` over all pairs, ties counting half."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if not x.size or not y.size:
        raise ValueError(f"probability_of_improvement needs two non-empty samples, got sizes {x.size} and {y.size}")
    return float(improvement_statistic(x, y))


def variance_split(p: float, variance: float, val_items: float) -> dict[str, float]:
    """Between-seed variance of an accuracy ``p`` split into binomial evaluation noise and training noise."""
    evaluation = p * (1.0 - p) / val_items if val_items and np.isfinite(val_items) else np.nan
    training = max(0.0, variance - evaluation) if np.isfinite(variance) and np.isfinite(evaluation) else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        share = evaluation / variance if np.isfinite(variance) and variance > 0 else np.nan
    return {"eval_variance": evaluation, "training_variance": training, "eval_share": share}
