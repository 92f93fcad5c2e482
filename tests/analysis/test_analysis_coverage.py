"""Intervals have the coverage they claim at the seed counts people run; power and seeds needed match known values.

Coverage is measured by simulation (fixed seeds) through the public functions: synthetic paired sweeps with a known
truth (baseline ~ N(0.7, 0.03), treatment = baseline + 0.01 + N(0, 0.02), paired by seed), many sweeps at once as
groups of one table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import aggregate, bootstrap, statistics

REPLICATES = 2000
TRUE_BASELINE, TRUE_DIFFERENCE = 0.7, 0.01


def _synthetic_sweeps(n: int, seed: int) -> pd.DataFrame:
    """``REPLICATES`` sweeps of ``n`` seeds x alpha {0, 0.5} as one summary table (group key ``sweep``)."""
    rng = np.random.default_rng(seed)
    baseline = rng.normal(TRUE_BASELINE, 0.03, size=(REPLICATES, n))
    treatment = baseline + TRUE_DIFFERENCE + rng.normal(0.0, 0.02, size=(REPLICATES, n))
    frames = [pd.DataFrame({"sweep": np.repeat(np.arange(REPLICATES), n), "seed": np.tile(np.arange(n), REPLICATES),
                            "alpha": alpha, "metric": "val/accuracy", "final_window": values.ravel()})
              for alpha, values in ((0.0, baseline), (0.5, treatment))]
    return pd.concat(frames, ignore_index=True)


def _covered(frame: pd.DataFrame, truth: float) -> float:
    return float(((frame["ci_low"] <= truth) & (truth <= frame["ci_high"])).mean())


@pytest.mark.parametrize("n", [2, 3, 5, 10, 20])
def test_group_mean_and_paired_difference_intervals_cover_95_percent(n: int) -> None:
    summaries = _synthetic_sweeps(n, seed=n)
    means = aggregate.aggregate_runs(summaries, group_keys=("sweep", "alpha"), n_bootstrap=100, random_state=0)
    baseline_means = means[means["alpha"] == 0.0]
    assert len(baseline_means) == REPLICATES and baseline_means["ci_low"].notna().all()
    assert 0.92 <= _covered(baseline_means, TRUE_BASELINE) <= 0.98

    # One table, one baseline group: every sweep's seeds are distinct (sweep * 1000 + seed) and its treatment runs
    # form their own group, so each pairs only with its own sweep's baseline runs.
    distinct = summaries.assign(seed=summaries["sweep"] * 1000 + summaries["seed"])
    distinct["group"] = np.where(distinct["alpha"] == 0.0, -1, distinct["sweep"])
    differences = aggregate.paired_differences(distinct, group_keys=("group",), baseline={"group": -1},
                                               n_bootstrap=100, random_state=0)
    assert len(differences) == REPLICATES and (differences["n_pairs"] == n).all()
    assert 0.92 <= _covered(differences, TRUE_DIFFERENCE) <= 0.98


@pytest.mark.parametrize("n", [3, 10])
def test_welch_interval_covers_95_percent(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    x = rng.normal(0.71, 0.02, size=(REPLICATES, n))
    y = rng.normal(0.70, 0.04, size=(REPLICATES, n))  # unequal spreads: Welch, not the pooled t
    results = pd.DataFrame([statistics.welch_t(a, b) for a, b in zip(x, y, strict=True)])
    assert 0.92 <= _covered(results, 0.01) <= 0.98


def test_bca_iqm_interval_is_refused_where_it_undercovers_and_covers_from_the_threshold_on() -> None:
    def coverage(n: int) -> float:
        data = np.random.default_rng(n).normal(0.7, 0.03, size=(1000, n))
        low, high = bootstrap.bca_interval([data], lambda x, axis=-1: statistics.interquartile_mean(x, axis=axis),
                                           n_bootstrap=999, random_state=0)
        return float(((low <= 0.7) & (0.7 <= high)).mean())

    assert bootstrap.MIN_BOOTSTRAP_N == 8
    with np.errstate(all="ignore"):
        original, bootstrap.MIN_BOOTSTRAP_N = bootstrap.MIN_BOOTSTRAP_N, 2  # measure below the threshold
        try:
            below = coverage(5)
        finally:
            bootstrap.MIN_BOOTSTRAP_N = original
    assert below < 0.92  # why intervals are refused at 5 seeds
    for n in (bootstrap.MIN_BOOTSTRAP_N, 20):
        assert 0.92 <= coverage(n) <= 0.98
    low, high = bootstrap.bca_interval([np.arange(5.0)], np.mean)
    assert np.isnan(low) and np.isnan(high)


# --- power, MDE, seeds needed, Holm ----------------------------------------------------------------------------------


def test_power_and_seeds_needed_match_published_values() -> None:
    # G*Power, one-sample / paired t, two-sided 5%, d = 0.5, power 0.8: n = 34 with actual power 0.8077775
    assert statistics.seeds_needed(1.0, 0.5) == 34
    assert statistics.t_power(0.5, 1.0, 34) == pytest.approx(0.8077775, abs=1e-6)
    assert statistics.t_power(0.5, 1.0, 33) < 0.8
    # Cohen (1988), two-sample t, d = 0.5: 64 per group
    assert statistics.seeds_needed(1.0, 0.5, paired=False) == 64
    # the spread scales out: sd 0.02 and a difference of 0.01 is d = 0.5 again
    assert statistics.seeds_needed(0.02, 0.01) == 34
    assert statistics.seeds_needed(1.0, 0.001, max_seeds=50) is None
    with pytest.raises(ValueError, match="effect"):
        statistics.seeds_needed(1.0, 0.0)


def test_mde_against_hand_computed_t_test_power() -> None:
    # one-sample t, n = 10, d = 1, two-sided 5%: power 0.8031 (G*Power), so the 80% MDE sits just below 1 sd
    assert statistics.t_power(1.0, 1.0, 10) == pytest.approx(0.803097, abs=1e-5)
    mde = statistics.minimum_detectable_effect(1.0, 10)
    assert mde == pytest.approx(0.99600, abs=2e-4)  # statsmodels TTestPower().solve_power(nobs=10, power=0.8)
    assert statistics.t_power(mde, 1.0, 10) == pytest.approx(0.8, abs=1e-9)
    assert statistics.minimum_detectable_effect(0.02, 10) == pytest.approx(0.02 * mde, rel=1e-6)
    assert statistics.minimum_detectable_effect(1.0, 34) < 0.5 < statistics.minimum_detectable_effect(1.0, 33)
    assert np.isnan(statistics.minimum_detectable_effect(1.0, 1)) and statistics.minimum_detectable_effect(0.0, 5) == 0


def test_holm_adjusted_p_values_by_hand() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4 x 0.005 = 0.02, 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 0.04)
    adjusted = statistics.holm_adjust([0.01, 0.04, 0.03, np.nan, 0.005])
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, np.nan, 0.02])
    summaries = pd.DataFrame({"alpha": [0.0] * 3 + [0.5] * 3 + [1.0] * 3, "seed": [1, 2, 3] * 3, "metric": "m",
                              "final_window": [0.5, 0.6, 0.7, 0.6, 0.62, 0.85, 0.5, 0.61, 0.72]})
    deltas = aggregate.paired_differences(summaries).set_index("alpha")
    np.testing.assert_allclose(deltas["p_holm"], statistics.holm_adjust(deltas["p_value"]))
    assert (deltas["p_holm"] >= deltas["p_value"]).all()


def test_variance_split_by_hand() -> None:
    # p = 0.7 on 1024 items: 0.21 / 1024 = 2.05e-4; seeds' variance 4e-4 -> training 1.95e-4, share 0.513
    split = statistics.variance_split(0.7, 4e-4, 1024)
    assert split["eval_variance"] == pytest.approx(0.21 / 1024)
    assert split["training_variance"] == pytest.approx(4e-4 - 0.21 / 1024)
    assert split["eval_share"] == pytest.approx(0.21 / 1024 / 4e-4)
    assert statistics.variance_split(0.7, 1e-4, 1024)["training_variance"] == 0.0  # floored: eval noise explains all


def test_a_constant_group_in_a_batch_gets_a_zero_width_interval_without_a_warning():
    import warnings

    from scipy import stats

    from analysis.bootstrap import bca_interval

    constant, varying = np.full(8, 0.756), np.linspace(0.70, 0.80, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", stats.DegenerateDataWarning)
        low, high = bca_interval([np.stack([constant, varying])], np.mean, random_state=0)
        low_constant, high_constant = bca_interval([constant], np.mean, random_state=0)
    assert (low_constant, high_constant) == (0.756, 0.756)
    assert low[1] < 0.75 < high[1]
