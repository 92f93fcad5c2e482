"""Table formatting for papers and browsers: LaTeX (booktabs, right-aligned, split to fit a column) and HTML."""

from __future__ import annotations

import re

import pandas as pd

from analysis import tables
from analysis.report import render_report_html
from analysis.report import build_report
from tests.analysis.synthetic import write_fake_sweep



def _aggregates() -> pd.DataFrame:
    """aggregate_runs-shaped rows: 3 alphas x (val/accuracy, response_length/mean), half-width 0.1 and 1.0."""
    rows = []
    for alpha, accuracy, length in ((0.0, 0.5, 100.0), (0.5, 0.7, 90.0), (1.0, 0.6, 120.0)):
        for metric, mean, half in (("val/accuracy", accuracy, 0.1), ("response_length/mean", length, 1.0)):
            rows.append({"alpha": alpha, "metric": metric, "n": 3, "mean": mean, "std": half, "iqm": mean,
                         "ci_low": mean - half, "ci_high": mean + half, "iqm_ci_low": mean - half,
                         "iqm_ci_high": mean + half})
    return pd.DataFrame(rows)


def _deltas() -> pd.DataFrame:
    return pd.DataFrame([
        {"alpha": alpha, "metric": "val/accuracy", "n_pairs": 3, "mean": mean, "baseline_mean": 0.5,
         "mean_difference": mean - 0.5, "ci_low": mean - 0.6, "ci_high": mean - 0.4, "prob_improvement": 0.875,
         "prob_ci_low": 0.5, "prob_ci_high": 1.0} for alpha, mean in ((0.5, 0.7), (1.0, 0.6))])


def tabulars(latex: str) -> list[str]:
    return re.findall(r"\\begin\{tabular\}\{[lr]+\}.*?\\bottomrule\n\\end\{tabular\}", latex, flags=re.S)


def test_latex_uses_booktabs_right_aligned_numbers_and_fits_a_column() -> None:
    table = tables.comparison_table(_aggregates(), deltas=_deltas(), metrics=["val/accuracy", "response_length/mean"],
                                    caption="Final accuracy")
    latex = tables.to_latex(table)
    blocks = tabulars(latex)
    # alpha + 3 value columns of ~18-32 characters do not fit 60 characters: split, the keys repeated in each block
    groups = tables.latex_column_groups(table)
    assert len(blocks) == len(groups) > 1
    assert [c for group in groups for c in group] == ["val/accuracy", "Δ val/accuracy", "response_length/mean"]
    for block, group in zip(blocks, groups, strict=True):
        assert re.match(r"\\begin\{tabular\}\{" + "r" * (1 + len(group)) + r"\}", block)  # every column numeric
        assert r"\toprule" in block and r"\midrule" in block and r"\bottomrule" in block
        width = sum(max(len(line) for line in tables._header_lines(c)) for c in ["alpha", *group])
        assert width <= tables.LATEX_MAX_WIDTH or len(group) == 1
    assert latex.count(r"\caption{") == 1 and r"\small" in latex
    assert r"response\_length/mean" in latex and r"0.500 $\pm$ 0.100 (3)" in latex
    one_block = tables.to_latex(table, max_width=200)
    assert len(tabulars(one_block)) == 1


def test_latex_escapes_special_characters_and_keeps_text_columns_left_aligned() -> None:
    assert tables.latex_escape("a_b 50% & $x ± Δ") == r"a\_b 50\% \& \$x $\pm$ $\Delta$"
    frame = _aggregates().assign(mechanism_label="ar_lopti")
    table = tables.comparison_table(frame, metrics=["val/accuracy"], group_keys=("mechanism_label", "alpha"))
    assert tabulars(tables.to_latex(table))[0].startswith(r"\begin{tabular}{lrr}")


def test_html_table_never_wraps_a_number() -> None:
    html = tables.to_html(tables.comparison_table(_aggregates(), metrics=["val/accuracy"]))
    assert 'class="dataflex"' in html and "white-space: nowrap" in html and "tabular-nums" in html
    assert "0.700 ± 0.100 (3)" in html


def test_report_html_page(tmp_path) -> None:
    report = build_report(write_fake_sweep(tmp_path / "s", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=20))
    page = report.with_suffix(".html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<table>" in page and "white-space: nowrap" in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert images and all((report.parent / image).is_file() for image in images)
    assert "<h2>Summary</h2>" in page
    assert "&lt;script&gt;" in render_report_html("<script>x</script>", "t")  # raw HTML in Markdown is escaped
