"""Seeds planned for a target precision, and wall-time estimates printed before long jobs start.

``make sweep TARGET_MDE=0.01 MAX_SEEDS=20`` (sweep keys ``target_mde``, ``max_seeds``, ``plan_metric``):

1. **Pilot**: the sweep's own seeds run as usual (at least 2; 3 or more give a steadier spread).
2. **Plan**: for every group against the baseline (alpha = 0, or the ``baseline`` preset), the standard deviation
   ``s_0`` of the pilot's seed-paired differences of ``plan_metric`` (final-window mean); the seeds Stein's two-stage
   test needs to detect ``target_mde`` with 80% power at a two-sided 5% level
   (:func:`analysis.statistics.stein_seeds_needed`); the plan is the largest of those, at most ``max_seeds``.
3. **Extension**: seeds ``max(pilot) + 1, ...`` up to the plan are added to the same sweep folder (same name, same
   overrides); completed runs are skipped, untouched. The plan (pilot spreads, seeds needed, the seeds run, the MDE
   expected at the planned size) is recorded under ``plan`` in ``sweep.json`` and printed in the report.

The plan depends on the pilot seeds only, never on the extension's results: the number of seeds is fixed before any
of them runs (no "run until significant"). The planned comparison is Stein's test (:func:`analysis.aggregate.
stein_two_stage`: the spread comes from the pilot), whose level is exact; the ordinary paired t over all seeds is
slightly liberal after a plan (about 8% false positives at a nominal 5% with a 3-seed pilot, because the pilot decides
both ``n`` and part of the spread), so the report prints the planned test beside it. The simulation in
``tests/sweeps/test_sweep_planning.py`` measures the planned sweep's false-positive rate. Running the same command
again recomputes the same plan from the same pilot and resumes whatever is missing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.aggregate import DEFAULT_FINAL_WINDOW
from analysis.statistics import DEFAULT_LEVEL, DEFAULT_POWER, stein_mde, stein_seeds_needed

# Measured by benchmarks/bench_eval.py on an idle machine (one thread per run, the default experiment): a GRPO step
# of 32 prompts x 8 rollouts and one greedy validation item. A shared machine is slower: estimates say so.
STEP_SECONDS = 0.66
VALIDATION_ITEM_SECONDS = 0.0008
RUN_OVERHEAD_SECONDS = 10.0  # process start, imports, model build, final write


@dataclasses.dataclass(frozen=True)
class SeedPlan:
    """The plan made from a pilot (see the module doc); ``comparisons``: one dict per group against the baseline."""

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
        """Whether ``max_seeds`` cut the plan below the seeds needed."""
        return self.seeds_needed > self.max_seeds

    def to_json(self) -> dict[str, Any]:
        """The plan as recorded under ``plan`` in sweep.json."""
        data = dataclasses.asdict(self)
        data.update(pilot_seeds=list(self.pilot_seeds), seeds=list(self.seeds), capped=self.capped,
                    comparisons=[dict(c) for c in self.comparisons])
        return data

    def describe(self) -> str:
        """One paragraph for the console and the report."""
        text = (f"seed plan for {self.metric}: the pilot ({len(self.pilot_seeds)} seeds) needs {self.seeds_needed} seeds to "
                f"detect |Δ| >= {self.target_mde:g} with {self.power:.0%} power at a two-sided {self.level:g} level; "
                f"planned {len(self.seeds)} seeds")
        if self.capped:
            text += f" (capped by max_seeds = {self.max_seeds})"
        return text + f", expected MDE {self.expected_mde:.4f}."


def planned_seed_count(std_differences: Sequence[float], pilot_size: int, target_mde: float, max_seeds: int,
                       *, power: float = DEFAULT_POWER, level: float = DEFAULT_LEVEL) -> tuple[int, int]:
    """``(seeds needed, seeds planned)`` from the pilot's paired spreads (one per comparison): needed = the largest
    :func:`analysis.statistics.stein_seeds_needed` over the comparisons; planned = needed, at most ``max_seeds``
    (never fewer than the pilot ran)."""
    needed = pilot_size
    for std in std_differences:
        if not math.isfinite(std):
            raise ValueError(f"a pilot comparison has no spread (std = {std!r}): the pilot needs >= 2 paired seeds")
        needed = max(needed, stein_seeds_needed(std, pilot_size, target_mde, power=power, level=level))
    return needed, max(pilot_size, min(max_seeds, needed))


def extended_seeds(pilot_seeds: Sequence[int], count: int) -> tuple[int, ...]:
    """The pilot seeds, then ``max(pilot) + 1, max(pilot) + 2, ...`` until there are ``count`` seeds."""
    seeds = list(pilot_seeds)
    next_seed = max(seeds) + 1
    while len(seeds) < count:
        seeds.append(next_seed)
        next_seed += 1
    return tuple(seeds)


def pilot_spreads(sweep_dir: Path, metric: str, pilot_seeds: Sequence[int],
                  final_window: int = DEFAULT_FINAL_WINDOW) -> list[dict[str, Any]]:
    """Per group against the baseline: ``group``, ``n_pairs``, ``std_difference`` of the pilot seeds' paired
    differences of ``metric`` (final-window mean), read from the sweep's run stores."""
    from analysis.aggregate import default_baseline, default_group_keys, paired_differences, run_summaries
    from analysis.load import load_sweep

    data = load_sweep(sweep_dir, metrics=[metric], histograms=False)
    included = data.included_runs
    pilot = included[included["seed"].isin(list(pilot_seeds))]
    group_keys = default_group_keys(pilot)
    if metric not in set(data.metric_names):
        logged = load_sweep(sweep_dir, histograms=False).metric_names  # every key, not only the one asked for
        raise ValueError(f"plan_metric = {metric!r} was not logged by the pilot runs; logged: {logged}")
    long = data.metrics[data.metrics["run"].isin(pilot["run"])]
    summaries = run_summaries(long, metrics=[metric], final_window=final_window)
    baseline = default_baseline(summaries, group_keys)
    if baseline is None:
        raise ValueError("a seed plan needs one baseline group (alpha = 0 or the baseline preset) in the pilot")
    deltas = paired_differences(summaries, group_keys=group_keys, baseline=baseline, n_bootstrap=100)
    return [{"group": {key: _plain(row[key]) for key in group_keys}, "n_pairs": int(row["n_pairs"]),
             "std_difference": float(row["std_difference"])} for _, row in deltas.iterrows()]


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def make_plan(sweep_dir: Path, metric: str, pilot_seeds: Sequence[int], target_mde: float,
              max_seeds: int) -> SeedPlan:
    """The :class:`SeedPlan` of a finished pilot in ``sweep_dir``."""
    comparisons = pilot_spreads(sweep_dir, metric, pilot_seeds)
    if not comparisons:
        raise ValueError("a seed plan needs at least one group besides the baseline")
    needed, planned = planned_seed_count([c["std_difference"] for c in comparisons], len(pilot_seeds), target_mde,
                                         max_seeds)
    pilot_size = len(pilot_seeds)
    for comparison in comparisons:
        comparison["seeds_needed"] = stein_seeds_needed(comparison["std_difference"], pilot_size, target_mde)
    expected = max(stein_mde(c["std_difference"], pilot_size, planned) for c in comparisons)
    return SeedPlan(metric=metric, target_mde=target_mde, max_seeds=max_seeds, pilot_seeds=tuple(pilot_seeds),
                    comparisons=tuple(comparisons), seeds_needed=needed,
                    seeds=extended_seeds(pilot_seeds, planned), expected_mde=float(expected))


def record_plan(sweep_dir: Path, plan: SeedPlan) -> None:
    """Write ``plan`` into ``sweep.json`` (kept by later invocations of the driver)."""
    from sweeps.manifest import save_plan

    save_plan(sweep_dir, plan.to_json())


def run_planned_sweep(config: Any, argv: Sequence[str], run_once: Callable[[Any, Sequence[str]], int]) -> int:
    """Pilot, plan, extension (module doc). ``run_once(config, argv)`` runs one sweep invocation (the driver's)."""
    from sweeps.grid import default_name

    name = config.name or default_name(config)  # the pilot's name: the extension grows the same folder
    sweep_dir = Path(config.root) / name
    pilot = dataclasses.replace(config, name=name, report=False)
    code = run_once(pilot, argv)
    if code:
        print(f"the pilot did not complete (exit status {code}); no seeds were planned", flush=True)
        return code
    try:
        plan = make_plan(sweep_dir, config.plan_metric, config.seeds, config.target_mde, config.max_seeds)
    except ValueError as error:
        print(f"error: no seed plan: {error}", flush=True)
        return 2
    record_plan(sweep_dir, plan)
    print(plan.describe(), flush=True)
    code = run_once(dataclasses.replace(config, name=name, seeds=plan.seeds, report=False), argv)
    record_plan(sweep_dir, plan)
    if config.report and code <= 128:
        from sweeps.progress import write_report
        from sweeps.runner import EXIT_FAILED

        failed, message = write_report(sweep_dir)
        print(message, flush=True)
        code = code or (EXIT_FAILED if failed else 0)
    return code


def estimate_seconds(runs: int, steps: int, jobs: int, *, val_items: int, evaluations: int,
                     warm_start: bool = False) -> float:
    """Wall seconds of ``runs`` runs, ``jobs`` at once, one thread each, from the idle-machine constants above."""
    per_run = steps * STEP_SECONDS + evaluations * val_items * VALIDATION_ITEM_SECONDS + RUN_OVERHEAD_SECONDS
    waves = math.ceil(runs / max(1, jobs))
    return waves * per_run + (60.0 if warm_start else 0.0)


def evaluations_in(steps: int, val_every: int) -> int:
    """Validations in a run: step 0, every ``val_every`` steps, and the last step."""
    points = {0, steps}
    if val_every > 0:
        points.update(range(val_every, steps + 1, val_every))
    return len(points)


def run_shape(config: Any) -> tuple[int, int, int]:
    """``(RL steps, validation items, validations)`` of one local run of ``config``, read from the resolved run
    config its common settings compose (:func:`sweeps.commands.common_config`: the trainer defaults under the
    sweep's ``steps``, experiment and ``extra`` overrides)."""
    from sweeps.commands import common_config

    values = common_config(config)
    steps = int(values["trainer.total_steps"])
    val_items = min(int(values["trainer.val_size"]), int(values["task.test_size"]))
    return steps, val_items, evaluations_in(steps, int(values["trainer.val_every"]))


def final_window_mean(run_dir: Path, key: str, window: int = DEFAULT_FINAL_WINDOW) -> float | None:
    """Mean of the last ``window`` logged values of ``key`` in a run store (the report's final-window value), or
    None when it logged none or its store cannot be read."""
    from dataflex_rl.tracking.run_store import final_value

    try:
        return final_value(run_dir, key, window=window)
    except (OSError, ValueError):
        return None


def describe_estimate(seconds: float, what: str) -> str:
    """"estimate: about N minutes for <what> (...)" with the constants it comes from."""
    return (f"estimate: about {seconds / 60:.0f} min for {what} on an idle machine ({STEP_SECONDS:g} s per RL step "
            f"and {VALIDATION_ITEM_SECONDS * 1e3:g} ms per validation item per run, one thread each, measured by "
            "benchmarks/bench_eval.py); a shared machine is slower")
