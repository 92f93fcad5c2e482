"""The probability-change figure: bars per advantage sign and old-probability bucket, one series per group, each bar
the mean over seeds of a run's time-averaged value (hand-made table, expected heights by hand)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.container import BarContainer

from analysis import plots
from dataflex_rl import keys

BUCKETS = ("0.00-0.25", "0.25-0.50", "0.50-0.75", "0.75-1.00")


def long_table() -> pd.DataFrame:
    """alpha 0 and 0.5 x seeds 1-3, measured at steps 10 and 20; correct_share of positive tokens in the lowest
    bucket = 0.9 at step 10 and 0.7 at step 20 for alpha 0 (time average 0.8), 0.6 and 0.6 for alpha 0.5, plus the
    seed / 100; every other cell 0.5."""
    rows = []
    for alpha in (0.0, 0.5):
        for seed in (1, 2, 3):
            for step in (10, 20):
                for sign in keys.ADVANTAGE_SIGNS:
                    for bucket in BUCKETS:
                        value = 0.5
                        if sign == "pos" and bucket == BUCKETS[0]:
                            value = (0.9 if step == 10 else 0.7) if alpha == 0.0 else 0.6
                            value += seed / 100
                        rows.append({"sweep": "s", "run": f"a{alpha}-s{seed}", "backend": "local",
                                     "mechanism": "reweight", "mechanism_label": None, "alpha": alpha, "seed": seed,
                                     "step": step, "metric": keys.prob_change(sign, bucket, "correct_share"),
                                     "value": value})
    return pd.DataFrame(rows)


def test_prob_change_bars_are_time_averaged_means_over_seeds():
    axes = plots.plot_prob_change(long_table(), stat="correct_share", n_bootstrap=100)
    assert len(axes) == 2
    positive = [c for c in axes[0].containers if isinstance(c, BarContainer)]
    assert len(positive) == 2 and all(len(bars) == 4 for bars in positive)  # 2 groups x 4 buckets
    # alpha 0: runs average (0.9 + 0.7) / 2 + seed / 100, so the mean over seeds 1-3 is 0.8 + 0.02
    assert positive[0][0].get_height() == pytest.approx(0.82)
    assert positive[1][0].get_height() == pytest.approx(0.62)
    assert positive[0][1].get_height() == pytest.approx(0.5)
    assert "positive advantage" in axes[0].get_title() and "negative advantage" in axes[1].get_title()
    plots.close(axes)


def test_prob_change_metrics_are_found_by_sign_and_stat_and_missing_ones_refused():
    names = [keys.prob_change("pos", "0.50-0.75", "mean_delta"), keys.prob_change("pos", "0.00-0.50", "mean_delta"),
             keys.prob_change("neg", "0.00-0.50", "mean_delta"), keys.PROB_CHANGE_CORRECT_SHARE]
    assert [item[1:] for item in plots.prob_change_metrics(names, "pos", "mean_delta")] == [(0.0, 0.5), (0.5, 0.75)]
    with pytest.raises(KeyError, match="prob_change/<sign>/<low>-<high>/mean_delta"):
        plots.plot_prob_change(long_table(), stat="mean_delta")
    plt.close("all")
