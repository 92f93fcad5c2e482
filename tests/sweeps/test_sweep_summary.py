"""The end-of-sweep summary is the report's own per-group table: the terminal and report.md never disagree."""

from __future__ import annotations

import io
import re

from rich.console import Console

from analysis.report import build_report
from tests.analysis.synthetic import write_fake_sweep
from sweeps.closing import print_group_summary


def markdown_section_rows(report: str, heading: str) -> list[list[str]]:
    """Cells of the first Markdown table under ``## <heading>`` (header row first, the rule row dropped)."""
    section = report.split(f"## {heading}\n", 1)[1]
    rows = []
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
            rows.append(cells)
    return rows


def terminal_rows(text: str) -> list[list[str]]:
    """Cells of each row of a rich table rendered with the default box characters."""
    return [[cell.strip() for cell in line.strip().strip("┃│").split("┃" if "┃" in line else "│")]
            for line in text.splitlines() if line.strip().startswith(("│", "┃"))]


def test_the_sweep_summary_prints_the_reports_summary_table(tmp_path):
    sweep_dir = write_fake_sweep(tmp_path / "sweep", alphas=(0.0, 0.5), seeds=(1, 2, 3), n_steps=30,
                                 failed=[(0.5, 3)], histograms=False, grad_stats=False)
    report = build_report(sweep_dir).read_text()
    out = io.StringIO()
    print_group_summary(sweep_dir, Console(file=out, width=300, color_system=None))

    expected = markdown_section_rows(report, "Summary")
    shown = terminal_rows(out.getvalue())
    assert shown == expected
    header, baseline, treated = expected
    assert header[1:3] == ["val/accuracy after SFT (step 0)", "val/accuracy final (mean of the last 5)"]
    assert header[-1] == "val/accuracy gain over SFT (final - step 0)"
    assert baseline[0] == "0" and baseline[-2] == "baseline"
    # the failed run is left out of the aggregate, and 2 seeds get no interval
    assert treated[0] == "0.5" and treated[2].endswith("(2, too few seeds)")


def test_the_summary_in_a_log_file_is_never_cropped(tmp_path):
    sweep_dir = write_fake_sweep(tmp_path / "sweep", alphas=(0.0, 0.5), seeds=(1, 2, 3), n_steps=30,
                                 histograms=False, grad_stats=False)
    out = io.StringIO()
    print_group_summary(sweep_dir, Console(file=out, width=80, color_system=None))  # not a terminal: 80 columns
    treated = [row for row in terminal_rows(out.getvalue()) if row[0] == "0.5"][0]
    assert re.search(r"MDE \d\.\d+$", treated[-2]), treated  # the delta cell is whole, down to its MDE
    assert re.fullmatch(r"-?\d\.\d+ ± \d\.\d+ \(3\)", treated[-1]), treated  # and so is the gain's
