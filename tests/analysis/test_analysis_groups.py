"""Group values compare by value and type: selectors, group keys, the baseline strata of the comparisons and the
comparison table's rows never go through the values' text."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import aggregate, groups, tables


def test_matching_rows_compares_numbers_as_numbers_and_text_as_text() -> None:
    frame = pd.DataFrame({
        "alpha": [0.0, 0.1 + 0.2, 0.5, np.nan],
        "seed": pd.array([1, 2, 100000, None], dtype="Int64"),
        "label": pd.Series(["0.5", "nan", "baseline", None], dtype="string"),
        "mechanism_label": pd.Categorical(["ar", "baseline", "ar", "ar"]),
    })
    assert groups.matching_rows(frame, {"alpha": 0.3}).tolist() == [False, True, False, False]
    assert groups.matching_rows(frame, {"alpha": np.float64(0.5)}).tolist() == [False, False, True, False]
    assert groups.matching_rows(frame, {"alpha": "0.5"}).tolist() == [False] * 4  # text never selects a number
    assert groups.matching_rows(frame, {"alpha": np.nan}).tolist() == [False, False, False, True]
    assert groups.matching_rows(frame, {"seed": 100001}).tolist() == [False] * 4  # integers exactly, not isclose
    assert groups.matching_rows(frame, {"seed": 2.0}).tolist() == [False, True, False, False]
    assert groups.matching_rows(frame, {"label": 0.5}).tolist() == [False] * 4  # a number never selects text
    assert groups.matching_rows(frame, {"label": "nan"}).tolist() == [False, True, False, False]  # not missing
    assert groups.matching_rows(frame, {"label": None}).tolist() == [False, False, False, True]
    assert groups.matching_rows(frame, {"mechanism_label": "baseline", "alpha": 0.3}).tolist() == [
        False, True, False, False]


def test_group_key_is_typed_and_hashable() -> None:
    assert groups.group_key([np.float64(0.5), np.int64(3), "a"]) == (0.5, 3, "a")
    assert groups.group_key([np.nan, None, pd.NA]) == (None, None, None)
    assert groups.group_key(["0.5"]) != groups.group_key([0.5])
    assert groups.group_key(["nan"]) != groups.group_key([np.nan])
    assert {groups.group_key([np.float64(1.0)]): "x"}[groups.group_key([1.0])] == "x"


def _summaries(labels: list[object], lr: list[float]) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"alpha": alpha, "trainer.lr": rate, "label": label, "seed": seed, "metric": "val/accuracy",
             "final_window": 0.6 + 0.01 * alpha + rng.normal(0, 0.01)}
            for label, rate in zip(labels, lr, strict=True) for alpha in (0.0, 1.0) for seed in range(4)]
    return pd.DataFrame(rows)


def test_a_text_factor_that_reads_as_missing_is_its_own_stratum() -> None:
    # the text "nan" and a missing value used to share the text "nan": one stratum with two baselines
    summaries = _summaries(["nan", None], [1e-4, 1e-4])
    summaries["label"] = summaries["label"].astype(object)
    deltas = aggregate.paired_differences(summaries, group_keys=("alpha", "label"), baseline={"alpha": 0.0},
                                          n_bootstrap=20)
    assert len(deltas) == 2 and (deltas["n_pairs"] == 4).all()
    for label in ("nan", None):
        rows = summaries[groups.matching_rows(summaries, {"label": label})]
        x = rows.loc[rows["alpha"] == 1.0, "final_window"].to_numpy()
        y = rows.loc[rows["alpha"] == 0.0, "final_window"].to_numpy()
        row = deltas[groups.matching_rows(deltas, {"label": label})].iloc[0]
        assert row["mean_difference"] == pytest.approx(np.mean(x - y))


def test_a_text_baseline_does_not_select_numbers() -> None:
    summaries = _summaries(["a"], [1e-4])
    with pytest.raises(ValueError, match="selects 0 groups"):
        aggregate.paired_differences(summaries, baseline={"alpha": "0.0"})
    assert aggregate.default_baseline(summaries, ("alpha",)) == {"alpha": 0.0}


def test_the_table_keeps_groups_apart_whose_labels_read_the_same() -> None:
    # alpha 0.5 and 0.5000001 both print as "0.5"; each row must still show its own numbers
    aggregates = pd.DataFrame({"alpha": [0.5, 0.5000001], "metric": "m", "n": [3, 3], "mean": [0.1, 0.9],
                               "std": 0.1, "iqm": [0.1, 0.9], "ci_low": [-0.1, 0.7], "ci_high": [0.3, 1.1],
                               "iqm_ci_low": np.nan, "iqm_ci_high": np.nan})
    table = tables.comparison_table(aggregates, metrics=["m"], digits=1)
    assert table.cells["alpha"].tolist() == ["0.5", "0.5"]
    assert table.cells["m"].tolist() == ["0.1 ± 0.2 (3)", "0.9 ± 0.2 (3)"]
