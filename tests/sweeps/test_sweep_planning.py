"""Seeds planned from a pilot: the plan by hand, its false-positive rate by simulation, and a sweep that plans, adds
seeds to its own folder and resumes (the driver with the scripted trainer, whose paired differences vary by seed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import statistics
from dataflex_rl.validation import ConfigError
from sweeps import seed_plan
from sweeps.cli import main
from sweeps.config import parse_sweep_config

from .conftest import SCRIPTED_TRAIN, read_manifest, runs_by_name


def test_planned_seed_count_by_hand() -> None:
    # Stein: 3-seed pilot, t_{0.975,2} = 4.302653, t_{0.8,2} = 1.060660: ((5.363313 * 0.02 / 0.01)^2 = 115.06 -> 116
    assert seed_plan.planned_seed_count([0.02], 3, 0.01, 200) == (116, 116)
    assert seed_plan.planned_seed_count([0.02, 0.01], 3, 0.01, 20) == (116, 20)  # the largest need, capped
    # 8-seed pilot: t_{0.975,7} = 2.364624, t_{0.8,7} = 0.896420: (3.261044 * 0.005 / 0.01)^2 = 2.66 -> the pilot's 8
    assert seed_plan.planned_seed_count([0.005], 8, 0.01, 20) == (8, 8)
    assert seed_plan.planned_seed_count([0.01], 8, 0.01, 20) == (11, 11)  # 3.261044^2 = 10.63 -> 11
    with pytest.raises(ValueError, match="pilot needs >= 2"):
        seed_plan.planned_seed_count([float("nan")], 3, 0.01, 20)
    assert seed_plan.evaluations_in(120, 20) == 7 and seed_plan.evaluations_in(130, 20) == 8


@pytest.mark.parametrize("pilot_size, target", [(3, 0.02), (5, 0.01)])
def test_a_plan_from_a_pilot_keeps_the_false_positive_rate_at_the_level(pilot_size: int, target: float) -> None:
    """True difference 0 (paired differences ~ N(0, 0.02)): a pilot, seeds planned from its spread (capped at 40),
    then the planned test over every seed, pilot included. The rate of p < 0.05 must stay <= 6%."""
    rng = np.random.default_rng(2024 + pilot_size)
    simulations, max_seeds = 4000, 40
    differences = rng.normal(0.0, 0.02, size=(simulations, max_seeds))
    rejections, planned_sizes = 0, []
    for row in differences:
        std = float(row[:pilot_size].std(ddof=1))
        _, planned = seed_plan.planned_seed_count([std], pilot_size, target, max_seeds)
        planned_sizes.append(planned)
        rejections += statistics.stein_two_stage(row[:planned], pilot_size)["p_value"] < 0.05
    rate = rejections / simulations
    assert 0.03 <= rate <= 0.06  # at the level, and the test does reject: the simulation measures something
    assert len(set(planned_sizes)) > 5  # the plan really varies with the pilot


def test_seeds_added_after_reading_the_spread_keep_the_tests_near_their_level() -> None:
    """A sweep of 20 seeds grown, for a comparison whose MDE missed 0.02, to the report's plug-in "you need N seeds"
    (capped at 43), a decision read from the spread, not the effect. True difference 0, paired differences
    ~ N(0, 0.04) (the Lopti arms' spread in the long-addition ablation): the paired t over every seed is only
    slightly liberal, and Stein's test with the first 20 seeds as its pilot keeps the level."""
    rng = np.random.default_rng(43)
    simulations, first, cap = 4000, 20, 43
    differences = rng.normal(0.0, 0.04, size=(simulations, cap))
    t_rejections = stein_rejections = 0
    sizes = []
    for row in differences:
        needed = statistics.seeds_needed(float(row[:first].std(ddof=1)), 0.02, max_seeds=cap)
        n = max(first, needed or cap)
        sizes.append(n)
        t_rejections += statistics.paired_t(row[:n], np.zeros(n))["p_value"] < 0.05
        stein_rejections += statistics.stein_two_stage(row[:n], first)["p_value"] < 0.05
    assert 0.04 <= t_rejections / simulations <= 0.07
    assert 0.04 <= stein_rejections / simulations <= 0.06
    assert 25 < np.mean(sizes) < cap and min(sizes) == first  # the rule really extends, and not always


def test_config_refuses_a_plan_it_cannot_make() -> None:
    with pytest.raises(ConfigError, match="pilot needs at least 2 seeds"):
        parse_sweep_config({"seeds": [1], "target_mde": 0.01})
    with pytest.raises(ConfigError, match="max_seeds = 2"):
        parse_sweep_config({"seeds": [1, 2, 3], "target_mde": 0.01, "max_seeds": 2})
    with pytest.raises(ConfigError, match="target_mde"):
        parse_sweep_config({"seeds": [1, 2, 3], "target_mde": -0.01})


@pytest.mark.slow
def test_a_planned_sweep_adds_seeds_to_its_folder_then_resumes_without_touching_completed_runs(
        tmp_path, repo_on_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SCRIPTED_TRAIN_NOISE", "0.02")
    sweep_dir = tmp_path / "runs" / "planned"
    argv = ["alpha=0.5", "seeds=1,2,3", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=planned",
            "target_mde=0.01", "max_seeds=5", f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false",
            "validate=false", "poll_s=0.05"]
    assert main(argv) == 0
    plan = read_manifest(sweep_dir)["plan"]
    # pilot spread of the paired differences (noise sd 0.02 on each side): far more than 5 seeds are needed
    assert plan["pilot_seeds"] == [1, 2, 3] and plan["target_mde"] == 0.01 and plan["max_seeds"] == 5
    assert plan["capped"] and plan["seeds"] == [1, 2, 3, 4, 5]
    (comparison,) = plan["comparisons"]
    pilot_differences = []
    for seed in (1, 2, 3):
        values = [json.loads((sweep_dir / f"a{alpha}-s{seed}" / "metrics.jsonl").read_text().splitlines()[-1])
                  ["val/accuracy"] for alpha in ("0.5", "0.0")]
        pilot_differences.append(values[0] - values[1])
    assert comparison["std_difference"] == pytest.approx(np.std(pilot_differences, ddof=1))
    assert plan["seeds_needed"] == statistics.stein_seeds_needed(comparison["std_difference"], 3, 0.01)
    assert plan["expected_mde"] == pytest.approx(statistics.stein_mde(comparison["std_difference"], 3, 5))
    runs = runs_by_name(sweep_dir)
    assert sorted(runs) == sorted(f"a{a}-s{s}" for a in ("0.0", "0.5") for s in range(1, 6))
    assert all(entry["state"] == "completed" and entry["attempts"] == 1 for entry in runs.values())
    output = capsys.readouterr().out
    assert "seed plan for val/accuracy" in output and "planned 5 seeds" in output
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "## Seed plan" in report and "planned 5 seeds" in report

    # The same command again: the same plan from the same pilot, nothing run twice, the plan still recorded.
    stamps = {name: (sweep_dir / name / "metrics.jsonl").stat().st_mtime_ns for name in runs}
    assert main(argv) == 0
    again = read_manifest(sweep_dir)
    assert again["plan"] == plan
    assert all(entry["attempts"] == 1 for entry in again["runs"])
    assert stamps == {name: (sweep_dir / name / "metrics.jsonl").stat().st_mtime_ns for name in runs}


@pytest.mark.slow
def test_a_real_two_alpha_sweep_plans_from_its_pilot_and_resumes(tmp_path, sft_cache) -> None:
    from .conftest import tiny_extra

    sweep_dir = tmp_path / "runs" / "real"
    argv = ["alpha=0.5", "seeds=1,2", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=real",
            "target_mde=0.01", "max_seeds=3", tiny_extra(sft_cache)]
    assert main(argv) == 0
    plan = read_manifest(sweep_dir)["plan"]
    assert plan["pilot_seeds"] == [1, 2] and 2 <= len(plan["seeds"]) <= 3
    expected = seed_plan.planned_seed_count([c["std_difference"] for c in plan["comparisons"]], 2, 0.01, 3)[1]
    assert len(plan["seeds"]) == expected
    runs = runs_by_name(sweep_dir)
    assert sorted(runs) == sorted(f"a{a}-s{s}" for a in ("0.0", "0.5") for s in plan["seeds"])
    assert all(entry["state"] == "completed" for entry in runs.values())
    assert main(argv) == 0  # resumed: nothing runs twice
    assert all(entry["attempts"] == 1 for entry in read_manifest(sweep_dir)["runs"])
