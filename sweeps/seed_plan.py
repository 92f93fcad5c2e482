"""Seeds planned for a target precision (``target_mde``: a pilot, Stein's two-stage plan from its paired spreads,
then the added seeds in the same folder; docs/sweeps.md, "How many seeds") and wall-time estimates printed before
long jobs start."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.aggregate import (DEFAULT_FINAL_WINDOW, default_baseline, default_group_keys, paired_differences,
                                run_summaries)
from analysis.statistics import DEFAULT_LEVEL, DEFAULT_POWER, stein_mde, stein_seeds_needed
from dataflex_rl.tracking.run_store import final_value
from sweeps.manifest import save_plan

# Measured by benchmarks/bench_eval.py on an idle machine, one thread per run, the default experiment.
STEP_SECONDS = 0.66
VALIDATION_ITEM_SECONDS = 0.0008
RUN_OVERHEAD_SECONDS = 10.0  # process start, imports, model build, final write


@dataclasses.dataclass(frozen=True)
class SeedPlan:
    """``comparisons``: one dict per group against the baseline."""

    metric: str
    target_mde: float
    max_seeds: int
    pilot_seeds: tuple[int, ...]
    comparisons: tuple[Mapping[str, Any], ...]
    seeds_needed: int
    seeds: tuple[int, ...]  # every seed of the planned sweep, pilot first
    expected_mde: float  # the largest MDE over the comparisons at the planned size, from the pilot spreads
    power: float = DEFAULT_POWER
    level: float = DEFAULT_LEVEL

    @property
    def capped(self) -> bool:
        return self.seeds_needed > self.max_seeds

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "pilot_seeds": list(self.pilot_seeds), "seeds": list(self.seeds),
                "capped": self.capped, "comparisons": [dict(c) for c in self.comparisons]}

    def describe(self) -> str:
        capped = f" (capped by max_seeds = {self.max_seeds})" if self.capped else ""
        return (f"seed plan for {self.metric}: the pilot ({len(self.pilot_seeds)} seeds) needs {self.seeds_needed} "
                f"seeds to detect |Δ| >= {self.target_mde:g} with {self.power:.0%} power at a two-sided "
                f"{self.level:g} level; planned {len(self.seeds)} seeds{capped}, expected MDE {self.expected_mde:.4f}.")


def planned_seed_count(std_differences: Sequence[float], pilot_size: int, target_mde: float, max_seeds: int,
                       *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL) -> tuple[int, int]:
    """``(seeds needed, seeds planned)``: at most ``max_seeds``, never below the pilot."""
    needed = pilot_size
    for std in std_differences:
        if not math.isfinite(std):
            raise ValueError(f"a pilot comparison has no spread (std = {std!r}): the pilot needs >= 2 paired seeds")
        needed = max(needed, stein_seeds_needed(std, pilot_size, target_mde, power=power, level=level))
    return needed, max(pilot_size, min(max_seeds, needed))


def pilot_spreads(sweep_dir: Path, metric: str, pilot_seeds: Sequence[int],
                  final_window: int = DEFAULT_FINAL_WINDOW) -> list[dict[str, Any]]:
    """Per group against the baseline: ``group``, ``n_pairs`` and ``std_difference`` of the pilot."""
    from analysis.load import load_sweep

    data = load_sweep(sweep_dir, metrics=[metric], histograms=False)
    included = data.included_runs
    pilot = included[included["seed"].isin(list(pilot_seeds))]
    group_keys = default_group_keys(pilot)
    if metric not in set(data.metric_names):
        logged = load_sweep(sweep_dir, histograms=False).metric_names  # every key, not only the one asked for
        raise ValueError(f"plan_metric = {metric!r} was not logged by the pilot runs; logged: {logged}")
    summaries = run_summaries(data.metrics[data.metrics["run"].isin(pilot["run"])], metrics=[metric],
                              final_window=final_window)
    baseline = default_baseline(summaries, group_keys)
    if baseline is None:
        raise ValueError("a seed plan needs one baseline group (alpha = 0 or the baseline preset) in the pilot")
    deltas = paired_differences(summaries, group_keys=group_keys, baseline=baseline, n_bootstrap=100)
    return [{"group": {key: row[key].item() if isinstance(row[key], np.generic) else row[key] for key in group_keys},
             "n_pairs": int(row["n_pairs"]), "std_difference": float(row["std_difference"])}
            for _, row in deltas.iterrows()]


def make_plan(sweep_dir: Path, metric: str, pilot_seeds: Sequence[int], target_mde: float,
              max_seeds: int) -> SeedPlan:
    comparisons = pilot_spreads(sweep_dir, metric, pilot_seeds)
    if not comparisons:
        raise ValueError("a seed plan needs at least one group besides the baseline")
    pilot_size = len(pilot_seeds)
    needed, planned = planned_seed_count([c["std_difference"] for c in comparisons], pilot_size, target_mde, max_seeds)
    for comparison in comparisons:
        comparison["seeds_needed"] = stein_seeds_needed(comparison["std_difference"], pilot_size, target_mde)
    expected = max(stein_mde(c["std_difference"], pilot_size, planned) for c in comparisons)
    return SeedPlan(metric=metric, target_mde=target_mde, max_seeds=max_seeds, pilot_seeds=tuple(pilot_seeds),
                    comparisons=tuple(comparisons), seeds_needed=needed,
                    seeds=(*pilot_seeds, *range(max(pilot_seeds) + 1, max(pilot_seeds) + 1 + planned - pilot_size)),
                    expected_mde=float(expected))


def run_planned_sweep(config: Any, argv: Sequence[str], run_once: Callable[[Any, Sequence[str]], int]) -> int:
    """Pilot, plan, extension; ``run_once(config, argv)`` runs one invocation without a plan."""
    sweep_dir = Path(config.root) / config.name  # the pilot's folder: the extension grows it
    once = dataclasses.replace(config, target_mde=None, max_seeds=None)
    code = run_once(dataclasses.replace(once, report=False), argv)
    if code:
        print(f"the pilot did not complete (exit status {code}); no seeds were planned", flush=True)
        return code
    try:
        plan = make_plan(sweep_dir, config.plan_metric, config.seeds, config.target_mde, config.max_seeds)
    except ValueError as error:
        print(f"error: no seed plan: {error}", flush=True)
        return 2
    save_plan(sweep_dir, plan.to_json())  # sweep.json keeps it in later invocations
    print(plan.describe(), flush=True)
    return run_once(dataclasses.replace(once, seeds=plan.seeds), argv)


def evaluations_in(steps: int, val_every: int) -> int:
    """Validations in a run: step 0, every ``val_every`` steps, and the last step."""
    return len({0, steps, *(range(val_every, steps + 1, val_every) if val_every > 0 else ())})


def estimate_seconds(config: Any, runs: int, jobs: int) -> tuple[float, int]:
    """(wall seconds of ``runs`` local runs of ``config``, ``jobs`` at once, one thread each; their RL steps)."""
    from dataflex_rl.local.sweep_backend import common_train_config

    values = common_train_config(config)
    steps = int(values["trainer.total_steps"])
    val_items = min(int(values["trainer.val_size"]), int(values["task.test_size"]))
    validation = evaluations_in(steps, int(values["trainer.val_every"])) * val_items * VALIDATION_ITEM_SECONDS
    return math.ceil(runs / max(1, jobs)) * (steps * STEP_SECONDS + validation + RUN_OVERHEAD_SECONDS), steps


def final_window_mean(run_dir: Path, key: str, window: int = DEFAULT_FINAL_WINDOW) -> float | None:
    """None when the run logged no ``key`` or its store cannot be read."""
    try:
        return final_value(run_dir, key, window=window)
    except (OSError, ValueError):
        return None


def describe_estimate(seconds: float, what: str) -> str:
    return (f"estimate: about {seconds / 60:.0f} min for {what} on an idle machine ({STEP_SECONDS:g} s per RL step "
            f"and {VALIDATION_ITEM_SECONDS * 1e3:g} ms per validation item per run, one thread each, measured by "
            "benchmarks/bench_eval.py); a shared machine is slower")
