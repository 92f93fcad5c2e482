"""Collapse as an outcome, on hand-made runs: the rule, the exact rate and McNemar test, the Kaplan-Meier curves, and
the report's section (present only when a run collapsed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import collapse, load, results
from analysis.collapse import CollapseRule
from analysis.report import main as report_main
from tests.analysis.synthetic import write_fake_run

STEPS = np.array([0, 10, 20, 30, 40, 50])


def outcome(values, steps=STEPS, rule=CollapseRule()):
    return collapse.run_outcome(np.asarray(steps), np.asarray(values, dtype=np.float64), rule)


def test_the_rule_by_hand() -> None:
    # step 0 at 0.20: the line is 0.15; from step 20 on every evaluation is below it (4 >= 3): collapsed at 20
    assert outcome([0.20, 0.25, 0.14, 0.10, 0.12, 0.09]) == {
        "start": 0.20, "end": 0.09, "collapsed": True, "step": 20, "judged": True}
    # back above the line at step 30: only the last 2 evaluations stay below it (2 < 3), censored at the last step
    assert outcome([0.20, 0.10, 0.10, 0.20, 0.10, 0.10])["collapsed"] is False
    assert outcome([0.20, 0.10, 0.10, 0.20, 0.10, 0.10])["step"] == 50
    # the same run is a collapse when 2 evaluations are enough, and with a margin of 0.2 nothing is
    assert outcome([0.20, 0.10, 0.10, 0.20, 0.10, 0.10], rule=CollapseRule(min_evaluations=2))["step"] == 40
    assert not outcome([0.20, 0.25, 0.14, 0.10, 0.12, 0.09], rule=CollapseRule(margin=0.2))["collapsed"]
    # a NaN evaluation is dropped, not read as a collapse or as a recovery
    assert outcome([0.20, 0.25, 0.14, np.nan, 0.12, 0.09])["step"] == 20
    # no step-0 value: not judged
    assert outcome([0.20, 0.10, 0.10, 0.10, 0.10], steps=[10, 20, 30, 40, 50])["judged"] is False
    with pytest.raises(ValueError, match="margin"):
        CollapseRule(margin=0.0)
    with pytest.raises(ValueError, match="min_evaluations"):
        CollapseRule(min_evaluations=0)


def test_exact_rate_and_mcnemar_by_hand() -> None:
    # Clopper-Pearson at k = 0 and k = n: [0, 1 - 0.025^(1/10)] = [0, 0.308498], [0.025^(1/10), 1] = [0.691502, 1]
    assert collapse.exact_rate(0, 10) == pytest.approx((0.0, 0.0, 0.308498), abs=1e-6)
    assert collapse.exact_rate(10, 10) == pytest.approx((1.0, 0.691502, 1.0), abs=1e-6)
    # McNemar exact: 5 discordant pairs all one way: 2 * 0.5^5 = 0.0625; 3 against 1: 2 * (1 + 4) / 16 = 0.625
    assert collapse.mcnemar_exact(5, 0) == pytest.approx(0.0625)
    assert collapse.mcnemar_exact(1, 3) == pytest.approx(0.625)
    assert collapse.mcnemar_exact(0, 0) == 1.0


def test_collapse_table_pairs_each_arm_with_the_baseline_of_its_cell() -> None:
    rows = []
    # lr 1e-4: the baseline collapses at seeds 1, 2; alpha 0.5 at seeds 2, 3, 4. lr 3e-5: nothing collapses.
    for lr, base, arm in ((1e-4, {1, 2}, {2, 3, 4}), (3e-5, set(), set())):
        for seed in range(1, 6):
            for alpha, collapsed in ((0.0, base), (0.5, arm)):
                rows.append({"run": f"a{alpha}-s{seed}-lr{lr}", "seed": seed, "alpha": alpha, "trainer.lr": lr,
                             "start": 0.2, "end": 0.0, "collapsed": seed in collapsed, "step": 50, "judged": True})
    table = collapse.collapse_table(pd.DataFrame(rows), ("alpha", "trainer.lr"),
                                    {"alpha": 0.0}).set_index(["alpha", "trainer.lr"])
    arm = table.loc[(0.5, 1e-4)]
    assert (arm["runs"], arm["collapsed"], arm["rate"]) == (5, 3, 0.6)
    assert (arm["rate_low"], arm["rate_high"]) == pytest.approx((0.146632, 0.947255), abs=1e-6)
    # pairs: seed 3 and 4 only the arm, seed 1 only the baseline, seed 2 both: 2 against 1, p = 2 * 4/8 = 1.0
    assert (arm["pairs"], arm["arm_only"], arm["baseline_only"], arm["p_mcnemar"]) == (5, 2, 1, 1.0)
    assert table.loc[(0.5, 3e-5)]["collapsed"] == 0 and np.isnan(table.loc[(0.0, 3e-5)]["p_mcnemar"])


def test_kaplan_meier_curve_and_its_interval_by_hand() -> None:
    frame = pd.DataFrame({"run": list("abcdef"), "seed": range(6), "alpha": 0.0, "judged": True,
                          "step": [10, 20, 30, 40, 100, 100], "collapsed": [True, True, False, True, False, False]})
    curve = collapse.survival_curves(frame, ("alpha",))
    # S(10) = 5/6, S(20) = 5/6 * 4/5, S(40) = 2/3 * 2/3 (runs at risk: 6, 5, then 3 after the censored 30)
    assert curve["step"].tolist() == [0, 10, 20, 40]
    assert curve["survival"].tolist() == pytest.approx([1.0, 5 / 6, 2 / 3, 4 / 9])
    # Greenwood at 10: 5/6 sqrt(1 / (6 * 5)) = 0.1521452; log(-log) scale: 0.1521452 / (5/6 |ln 5/6|) = 1.0013856,
    # S^exp(+-1.959964 * 1.0013856) = (5/6)^7.117271 and (5/6)^0.140503 = [0.273123, 0.974712]
    assert (curve["low"][1], curve["high"][1]) == pytest.approx((0.273123, 0.974712), abs=1e-5)


def write_runs(sweep_dir: Path, collapsing: set[tuple[float, int]]) -> None:
    steps = np.arange(0, 101)
    for alpha in (0.0, 0.5):
        for seed in (1, 2, 3, 4):
            accuracy = np.full(steps.size, np.nan)
            evaluated = steps % 10 == 0
            falling = (alpha, seed) in collapsing
            accuracy[evaluated] = np.where((steps[evaluated] >= 40) & falling, 0.01, 0.2 + 0.01 * seed)
            write_fake_run(sweep_dir / f"a{alpha}-s{seed}", steps=steps, alpha=alpha, seed=seed,
                           metrics={"val/accuracy": accuracy, "critic/score/mean": np.full(steps.size, 0.5)})


def test_the_report_has_a_collapse_section_only_when_a_run_collapsed(tmp_path: Path) -> None:
    write_runs(tmp_path / "collapsing", {(0.0, 1), (0.0, 2), (0.5, 2)})
    assert report_main([str(tmp_path / "collapsing")]) == 0
    report = (tmp_path / "collapsing" / "report" / "report.md").read_text()
    section = report.split("## Collapse", 1)[1].split("\n## ", 1)[0]
    assert "fell at least 0.05 below" in section and "fig_collapse_survival.png" in section
    assert "0.50 [0.07, 0.93]" in section and "0.25 [0.01, 0.81]" in section  # 2/4 and 1/4, Clopper-Pearson
    assert (tmp_path / "collapsing" / "report" / "fig_collapse_survival.png").is_file()
    write_runs(tmp_path / "steady", set())
    assert report_main([str(tmp_path / "steady")]) == 0
    assert "## Collapse" not in (tmp_path / "steady" / "report" / "report.md").read_text()
    assert report_main([str(tmp_path / "collapsing"), "--collapse-margin", "0.3"]) == 0
    assert "## Collapse" not in (tmp_path / "collapsing" / "report" / "report.md").read_text()


def test_a_results_file_shows_the_collapse_rates_only_when_a_run_collapsed(tmp_path: Path) -> None:
    write_runs(tmp_path / "collapsing", {(0.0, 1), (0.0, 2), (0.5, 2)})
    sweep = tmp_path / "collapsing"
    text = results.results_text(load.load_sweep(sweep, histograms=False), "c", sweep)
    section = text.split("Collapse:", 1)[1].split("Measured on:", 1)[0]
    assert "fell at least 0.05 below" in section
    assert "0.50 [0.07, 0.93]" in section and "0.25 [0.01, 0.81]" in section  # 2/4 and 1/4, Clopper-Pearson
    write_runs(tmp_path / "steady", set())
    assert "Collapse:" not in results.results_text(load.load_sweep(tmp_path / "steady", histograms=False), "s",
                                                  tmp_path / "steady")
