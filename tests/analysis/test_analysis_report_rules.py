"""Report rules: no interval and no bold below 3 seeds, bold only where the paired interval excludes 0, what every
comparison could detect, the evaluation/training noise split, and the final-vs-alpha figure (dots, reference line,
an axis that does not exaggerate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from analysis import aggregate, plots, report, statistics
from tests.analysis.synthetic import write_fake_run

FAST = ["--bootstrap", "200"]


def _sweep(root: Path, accuracy: dict[tuple[float, int], float], val_size: int = 1024) -> Path:
    """Runs with val/accuracy 0.6 at step 0, then ``accuracy[(alpha, seed)]`` at steps 10..50."""
    for (alpha, seed), final in accuracy.items():
        write_fake_run(root / f"a{alpha}-s{seed}", sweep="rules", run=f"a{alpha}-s{seed}", alpha=alpha, seed=seed,
                       steps=[0, 10, 20, 30, 40, 50], metrics={"val/accuracy": [0.6] + [final] * 5},
                       config={"seed": seed, "trainer": {"val_size": val_size}, "task": {"test_size": 2048},
                               "dataflex": {"actuator": {"params": {"alpha": alpha}}}})
    return root


def test_a_two_seed_report_has_no_bold_and_no_interval(tmp_path: Path) -> None:
    # the example: 0.533 against 0.532 must not be bold, and two values get no "CI"
    sweep = _sweep(tmp_path / "two", {(0.0, 1): 0.532, (0.0, 2): 0.531, (0.5, 1): 0.533, (0.5, 2): 0.534})
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    final_table = text.split("## Final-window mean", 1)[1].split("##", 1)[0]
    assert "**" not in final_table
    rows = [line for line in final_table.splitlines() if line.startswith("|") and "seeds" in line]
    assert len(rows) == 2 and all("±" not in row and "[" not in row for row in rows)
    assert "0.532 (2, too few seeds)" in rows[0] and "+0.002 (2 seeds, too few seeds)" in rows[1]
    assert "with 2 seeds this sweep can detect |Δ| >=" in text


def test_bold_only_where_the_paired_interval_excludes_zero_and_detectable_sizes(tmp_path: Path) -> None:
    accuracy = {}
    for seed, base in zip(range(1, 7), (0.70, 0.72, 0.68, 0.71, 0.69, 0.73), strict=True):
        accuracy[(0.0, seed)] = base
        accuracy[(0.5, seed)] = base + 0.02 + 0.002 * (seed % 2)  # a clear, consistent gain
        accuracy[(1.0, seed)] = base + (0.004 if seed % 2 else -0.004)  # no gain on average
    sweep = _sweep(tmp_path / "six", accuracy, val_size=256)
    assert report.main([str(sweep), *FAST, "--target-effect", "0.005"]) == 0
    text = (sweep / "report" / "report.md").read_text()
    final_table = text.split("## Final-window mean", 1)[1].split("##", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in final_table.splitlines() if line.startswith("|")}
    row_05, row_1 = rows["0.5"], rows["1"]
    assert row_05.count("**") == 2 and "**+0.021 [" in row_05 and "Holm" in row_05 and "MDE" in row_05
    assert "**" not in row_1
    assert "**Bold**: a Δ whose paired interval excludes 0" in text
    # per comparison: what it could detect, and the seeds a 0.005 difference needs
    deltas = aggregate.paired_differences(aggregate.run_summaries(
        report.load_sweep(sweep).metrics, metrics=["val/accuracy"]))
    row = deltas.set_index("alpha").loc[1.0]
    needed = statistics.seeds_needed(row["std_difference"], 0.005)
    assert (f"alpha=1 against the baseline: with 6 seeds this sweep can detect |Δ| >= {row['mde']:.4f}; to detect "
            f"0.005 you need {needed} seeds.") in text
    # evaluation noise on 256 items (p ~ 0.7: SD 0.029) exceeds the seeds' spread (SD ~0.02): the report says what
    # that means instead of asking for more items
    split = text.split("## Evaluation noise against training noise", 1)[1].split("## Figures", 1)[0]
    assert "256" in split and "share above 100%" in split and "would sharpen" not in split


def test_final_vs_alpha_shows_every_seed_a_reference_and_an_honest_axis() -> None:
    summaries = pd.DataFrame({"alpha": [0.0, 0.0, 0.5, 0.5, 0.5], "seed": [1, 2, 1, 2, 3], "metric": "val/accuracy",
                              "final_window": [0.532, 0.531, 0.533, 0.534, 0.535]})
    aggregates = aggregate.aggregate_runs(summaries)
    ax = Figure().add_subplot()
    plots.plot_metric_vs_alpha(aggregates, "val/accuracy", ax=ax, per_seed=summaries, reference=0.52)
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in dots) == 5  # every seed
    np.testing.assert_allclose(sorted(np.concatenate([c.get_offsets()[:, 1] for c in dots])),
                               sorted(summaries["final_window"]))
    assert any(np.allclose(line.get_ydata(), 0.52) for line in ax.get_lines())  # the after-SFT line
    low, high = ax.get_ylim()
    assert high - low >= 0.1 - 1e-12 and low <= 0.52 and high >= 0.535  # 4 items' worth does not fill the plot
    error_bars = [line for line in ax.get_lines() if line.get_linestyle() == "None" and len(line.get_xdata()) == 2]
    assert len(error_bars) <= 2  # caps drawn for alpha 0.5 (3 seeds) only; alpha 0 (2 seeds) has none
