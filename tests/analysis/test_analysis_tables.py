"""Comparison tables: cell text, the bold rule, too few seeds, deltas, and the four writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import tables


def _aggregates() -> pd.DataFrame:
    rows = []
    for alpha, accuracy, length in ((0.0, 0.5, 100.0), (0.5, 0.7, 90.0), (1.0, 0.6, 120.0)):
        rows.append({"alpha": alpha, "metric": "val/accuracy", "n": 3, "mean": accuracy, "std": 0.1, "iqm": accuracy,
                     "ci_low": accuracy - 0.1, "ci_high": accuracy + 0.1, "iqm_ci_low": accuracy - 0.2,
                     "iqm_ci_high": accuracy + 0.2})
        rows.append({"alpha": alpha, "metric": "response_length/mean", "n": 3, "mean": length, "std": 1.0,
                     "iqm": length, "ci_low": length - 1.0, "ci_high": length + 1.0, "iqm_ci_low": length - 1.0,
                     "iqm_ci_high": length + 1.0})
    return pd.DataFrame(rows)


def _deltas() -> pd.DataFrame:
    return pd.DataFrame([
        {"alpha": 0.5, "metric": "val/accuracy", "n_pairs": 3, "mean": 0.7, "baseline_mean": 0.5,
         "mean_difference": 0.2, "ci_low": 0.1, "ci_high": 0.3, "p_value": 0.012, "p_holm": 0.024, "mde": 0.15,
         "prob_improvement": 0.875, "prob_ci_low": np.nan, "prob_ci_high": np.nan},
        {"alpha": 1.0, "metric": "val/accuracy", "n_pairs": 0, "mean": np.nan, "baseline_mean": np.nan,
         "mean_difference": np.nan, "ci_low": np.nan, "ci_high": np.nan, "p_value": np.nan, "p_holm": np.nan,
         "mde": np.nan, "prob_improvement": np.nan, "prob_ci_low": np.nan, "prob_ci_high": np.nan},
    ])


def test_cells_bold_only_significant_differences() -> None:
    table = tables.comparison_table(_aggregates(), deltas=_deltas(), metrics=["val/accuracy", "response_length/mean"])
    cells = table.cells
    assert len(cells) == 3 and cells["alpha"].tolist() == ["0", "0.5", "1"]
    assert cells["val/accuracy"].tolist() == ["0.500 ± 0.100 (3)", "0.700 ± 0.100 (3)", "0.600 ± 0.100 (3)"]
    assert not table.best["val/accuracy"].any() and not table.best["response_length/mean"].any()  # no mean is bold
    assert cells["Δ val/accuracy"].tolist() == [
        "baseline", "+0.200 [+0.100, +0.300] p=0.01 (Holm p=0.02) MDE 0.150", "n/a (no common seed)"]
    assert table.best["Δ val/accuracy"].tolist() == [False, True, False]  # [0.1, 0.3] excludes 0
    assert "Δ response_length/mean" not in cells  # no paired differences given for that metric
    numbers = table.numbers.set_index(["alpha", "metric"])
    assert numbers.loc[(0.5, "val/accuracy"), "mean_difference"] == 0.2
    assert numbers.loc[(0.5, "val/accuracy"), "difference_ci_low"] == 0.1
    assert numbers.loc[(0.5, "val/accuracy"), "mde"] == 0.15


def test_interval_containing_zero_or_too_few_seeds_is_never_bold() -> None:
    deltas = _deltas()
    deltas.loc[0, ["ci_low", "ci_high"]] = [-0.05, 0.45]
    table = tables.comparison_table(_aggregates(), deltas=deltas, metrics=["val/accuracy"])
    assert not table.best.to_numpy().any()
    two_seeds = _aggregates().assign(n=2)
    deltas.loc[0, ["n_pairs", "ci_low", "ci_high"]] = [2, 0.1, 0.3]
    table = tables.comparison_table(two_seeds, deltas=deltas, metrics=["val/accuracy"])
    assert table.cells["val/accuracy"].tolist()[0] == "0.500 (2, too few seeds)"
    assert table.cells["Δ val/accuracy"].tolist()[1] == "+0.200 (2 seeds, too few seeds)"
    assert not table.best.to_numpy().any() and "[" not in tables.to_markdown(table).split("\n", 2)[2]


def test_pairs_that_all_differ_by_the_same_amount_show_no_spread_not_an_mde_of_zero() -> None:
    deltas = _deltas()
    deltas.loc[0, ["mean_difference", "ci_low", "ci_high", "p_value", "p_holm", "mde"]] = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    table = tables.comparison_table(_aggregates(), deltas=deltas, metrics=["val/accuracy"])
    assert table.cells["Δ val/accuracy"].tolist()[1] == "+0.000 [+0.000, +0.000] p=1.00 (Holm p=1.00) no spread"


def test_interval_style_and_iqm() -> None:
    table = tables.comparison_table(_aggregates(), metrics=["val/accuracy"], style="interval", statistic="iqm")
    assert table.cells["val/accuracy"].tolist()[0] == "0.500 [0.300, 0.700] (3)"
    with pytest.raises(ValueError, match="style"):
        tables.comparison_table(_aggregates(), style="fancy")
    with pytest.raises(KeyError, match="nope"):
        tables.comparison_table(_aggregates(), metrics=["nope"])


def test_writers(tmp_path: Path) -> None:
    table = tables.comparison_table(_aggregates(), deltas=_deltas(), caption="Final accuracy")
    markdown = tables.to_markdown(table)
    assert "**+0.200 [+0.100, +0.300]" in markdown and markdown.count("\n") == 4  # header, rule, 3 rows
    assert "**0.700" not in markdown
    latex = tables.to_latex(table)
    assert r"\bfseries +0.200" in latex and r"response\_length/mean" in latex
    assert r"$\Delta$ val/accuracy" in latex and r"\toprule" in latex and "Final accuracy" in latex
    html = tables.to_html(table)
    assert "font-weight: bold" in html and "0.700 ± 0.100 (3)" in html and "+0.200 [+0.100, +0.300]" in html
    written = tables.write_table(table, tmp_path / "out", "summary")
    assert sorted(written) == ["csv", "html", "md", "tex"] and all(path.is_file() for path in written.values())
    csv = pd.read_csv(written["csv"])
    assert len(csv) == 6 and {"alpha", "metric", "mean", "ci_low", "mean_difference"} <= set(csv.columns)
    with pytest.raises(ValueError, match="formats"):
        tables.write_table(table, tmp_path, "x", formats=["docx"])
