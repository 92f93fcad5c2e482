"""Seeds planned from a pilot: the plan by hand, its false-positive rate by simulation, and a sweep that plans, adds
seeds to its own folder and resumes (the driver with the scripted trainer, whose paired differences vary by seed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis import power, statistics
from dataflex_rl.validation import ConfigError
from sweeps.cli import main
from sweeps.sweep_config import parse_sweep_config

from .conftest import SCRIPTED_TRAIN, read_manifest, runs_by_name


def test_a_look_judges_each_comparison_by_hand() -> None:
    """MDE first, then the 99.9% interval, then the cap; else Stein's need from the spread, at least 1.5x the seeds."""
    def judged(n: int, mean: float, std: float) -> tuple[str, int]:
        return power.judge({"n_pairs": n, "mean_difference": mean, "std_difference": std}, 0.05, 40)

    assert judged(5, 0.0, 0.01) == ("precise", 5)  # MDE 0.0168 at 5 seeds
    # MDE 0.084 > 0.05; the 99.9% half-width t_{0.9995,4} 0.05 / sqrt(5) = 8.610302 * 0.022361 = 0.19253
    assert judged(5, 0.2, 0.05) == ("effect", 5)
    # inside it: Stein's need ((t_{0.975,4} + t_{0.8,4}) 0.05 / 0.05)^2 = 3.717410^2 = 13.82 -> 14 (> 1.5 * 5)
    assert judged(5, 0.19, 0.05) == ("grow", 14)
    # MDE 0.0518 at 10 seeds; Stein's need (3.145561 * 0.052 / 0.05)^2 = 10.70 -> 11, below 1.5 * 10 = 15
    assert judged(10, 0.0, 0.052) == ("grow", 15)
    assert judged(30, 0.0, 0.2) == ("grow", 40)  # Stein's need 510, capped
    assert judged(40, 0.0, 0.5) == ("capped", 40)
    with pytest.raises(ValueError, match="no spread"):
        judged(1, 0.0, float("nan"))
    assert power.seed_order((1, 2, 3), 7) == (1, 2, 3, 4, 5, 6, 7) and power.seed_order((3, 5), 4) == (3, 5, 6, 7)


def simulate_plan(differences: np.ndarray, pilot: int, target: float, cap: int) -> int:
    """The seeds one cell ends with under the plan's looks (its first ``n`` paired differences at each look)."""
    n = pilot
    while True:
        x = differences[:n]
        decision, n_next = power.judge({"n_pairs": n, "mean_difference": x.mean(), "std_difference": x.std(ddof=1)},
                                       target, cap)
        if decision != "grow":
            return n
        n = n_next


@pytest.mark.parametrize("std", [0.05, 0.1, 0.3])
def test_the_plans_looks_keep_steins_test_at_its_level_and_the_paired_t_near_it(std: float) -> None:
    """True difference 0, paired differences ~ N(0, std): a 5-seed pilot, looks until each cell is decided or has 40
    seeds (target 0.05: 0.05 is the spread where stopping on a small spread inflates the paired t most, 0.3 one that
    always reaches the cap). Stein's test with the pilot's spread keeps its level; the paired t over all seeds stays
    below 8.5% (the report states 8%)."""
    rng = np.random.default_rng(47 + int(std * 100))
    simulations, pilot, cap = 3000, 5, 40
    differences = rng.normal(0.0, std, size=(simulations, cap))
    t_rejections = stein_rejections = 0
    sizes = []
    for row in differences:
        n = simulate_plan(row, pilot, 0.05, cap)
        sizes.append(n)
        t_rejections += statistics.paired_t(row[:n], np.zeros(n))["p_value"] < 0.05
        stein_rejections += statistics.stein_two_stage(row[:n], pilot)["p_value"] < 0.05
    assert 0.035 <= stein_rejections / simulations <= 0.065
    assert 0.035 <= t_rejections / simulations <= 0.085
    assert len(set(sizes)) > 1 or std == 0.3  # the looks really vary the seeds
    assert (np.mean(sizes) > 39) == (std == 0.3)


def test_config_refuses_a_plan_it_cannot_make() -> None:
    with pytest.raises(ConfigError, match="pilot needs at least 2 seeds"):
        parse_sweep_config({"seeds": [1], "target_mde": 0.01})
    with pytest.raises(ConfigError, match="max_seeds = 2"):
        parse_sweep_config({"seeds": [1, 2, 3], "target_mde": 0.01, "max_seeds": 2})
    with pytest.raises(ConfigError, match="target_mde"):
        parse_sweep_config({"seeds": [1, 2, 3], "target_mde": -0.01})


@pytest.mark.slow
def test_a_planned_sweep_grows_only_its_undecided_cell_then_resumes_without_touching_completed_runs(
        tmp_path, repo_on_path, monkeypatch, capsys) -> None:
    """Two learning rates: at 0.001 the seeds agree (MDE below target at the pilot), at 0.002 they spread (0.5 noise,
    far too much for the 99.9% interval of alpha's +0.5 at 3 seeds to exclude 0), so only that cell gets seeds 4 and
    5 (Stein's need, capped at 5)."""
    monkeypatch.setenv("SCRIPTED_TRAIN_NOISE", "0.5")
    monkeypatch.setenv("SCRIPTED_TRAIN_QUIET_LR", "0.001")
    sweep_dir = tmp_path / "runs" / "planned"
    argv = ["alpha=0.5", "seeds=1,2,3", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=planned",
            "target_mde=0.05", "max_seeds=5", "extra=[trainer.lr=0.001,0.002]", f"train_module={SCRIPTED_TRAIN}",
            "local.sft_warm_start=false", "validate=false", "poll_s=0.05"]
    assert main(argv) == 0
    plan = read_manifest(sweep_dir)["plan"]
    assert plan["pilot_seeds"] == [1, 2, 3] and plan["target_mde"] == 0.05 and plan["max_seeds"] == 5
    assert plan["cell_keys"] == ["trainer.lr"] and len(plan["looks"]) == 2
    first = {cell["cell"]["trainer.lr"]: cell for cell in plan["looks"][0]}
    assert first[0.001]["seeds"] == first[0.001]["seeds_next"] == 3
    assert first[0.001]["comparisons"][0]["decision"] == "precise"
    assert first[0.002]["seeds"] == 3 and first[0.002]["seeds_next"] == 5
    (comparison,) = first[0.002]["comparisons"]
    pilot_differences = []
    for seed in (1, 2, 3):
        values = [json.loads((sweep_dir / f"a{alpha}-s{seed}-lr0.002" / "metrics.jsonl").read_text().splitlines()[-1])
                  ["val/accuracy"] for alpha in ("0.5", "0.0")]
        pilot_differences.append(values[0] - values[1])
    assert comparison["std_difference"] == pytest.approx(np.std(pilot_differences, ddof=1))
    assert comparison["seeds_next"] == min(5, statistics.stein_seeds_needed(comparison["std_difference"], 3, 0.05))
    assert {cell["cell"]["trainer.lr"]: cell["seeds"] for cell in plan["looks"][1]} == {0.001: 3, 0.002: 5}
    runs = runs_by_name(sweep_dir)
    assert sorted(runs) == sorted([*(f"a{a}-s{s}-lr0.001" for a in ("0.0", "0.5") for s in range(1, 4)),
                                   *(f"a{a}-s{s}-lr0.002" for a in ("0.0", "0.5") for s in range(1, 6))])
    assert all(entry["state"] == "completed" and entry["attempts"] == 1 for entry in runs.values())
    output = capsys.readouterr().out
    assert "trainer.lr=0.002: 3 seeds: grow (MDE" in output and "grows to 5 seeds" in output
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "## Seed plan" in report and "3 -> 5" in report and "Stein's test over 5 seeds" in report

    # The same command again: the same looks from the same runs, nothing run twice.
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
    (cell,) = plan["looks"][-1]
    assert plan["pilot_seeds"] == [1, 2] and 2 <= cell["seeds"] <= 3
    runs = runs_by_name(sweep_dir)
    assert sorted(runs) == sorted(f"a{a}-s{s}" for a in ("0.0", "0.5") for s in range(1, cell["seeds"] + 1))
    assert all(entry["state"] == "completed" for entry in runs.values())
    assert main(argv) == 0  # resumed: nothing runs twice
    assert all(entry["attempts"] == 1 for entry in read_manifest(sweep_dir)["runs"])
