"""Seeds planned for a target precision (``target_mde``), cell by cell: a pilot, then looks at which each cell of the
grid's other factors still undecided gets more seeds in the same folder, up to ``max_seeds`` (docs/sweeps.md, "How
many seeds")."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analysis.aggregate import (DEFAULT_FINAL_WINDOW, default_baseline, default_group_keys, paired_differences,
                                run_summaries)
from analysis.groups import baseline_strata
from analysis.power import GROWTH, INTERIM_LEVEL, judge, seed_order
from analysis.statistics import DEFAULT_LEVEL, DEFAULT_POWER
from dataflex_rl.tracking.identity import same_arm
from sweeps.manifest import save_plan
from sweeps.sweep_config import plan_cap



def look(sweep_dir: Path, metric: str, seeds_of: Callable[[Mapping[str, Any]], Sequence[int]],
         final_window: int = DEFAULT_FINAL_WINDOW) -> tuple[list[str], list[dict[str, Any]]]:
    """``(cell keys, comparisons)``: each group against the baseline of its cell (the stratum of the other factors),
    paired over the cell's planned seeds only (``seeds_of(cell)``)."""
    from analysis.load import load_sweep
    from analysis.report import with_group_columns

    data = load_sweep(sweep_dir, metrics=[metric], histograms=False)
    if metric not in set(data.metric_names):
        logged = load_sweep(sweep_dir, histograms=False).metric_names  # every key, not only the one asked for
        raise ValueError(f"plan_metric = {metric!r} was not logged by the runs; logged: {logged}")
    group_keys = default_group_keys(data.included_runs)
    summaries = run_summaries(with_group_columns(data, group_keys).metrics, metrics=[metric],
                              final_window=final_window)
    baseline = default_baseline(summaries, group_keys)
    if baseline is None:
        raise ValueError("a seed plan needs one baseline group (alpha = 0 or the baseline preset) in every cell")
    cell_keys = baseline_strata(summaries, group_keys, baseline)[0]
    planned = [seed in seeds_of(dict(zip(cell_keys, (row[key] for key in cell_keys), strict=True)))
               for row, seed in zip(summaries.to_dict("records"), summaries["seed"], strict=True)]
    deltas = paired_differences(summaries[planned], group_keys=group_keys, baseline=baseline, n_bootstrap=100)
    comparisons = [{"group": {key: plain(row[key]) for key in group_keys},
                    **{key: plain(row[key]) for key in ("n_pairs", "mean_difference", "std_difference", "mde")}}
                   for row in deltas.to_dict("records")]
    return cell_keys, comparisons


def plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def run_planned_sweep(config: Any, argv: Sequence[str], run_once: Callable[..., int]) -> int:
    """Pilot, then looks: each cell still undecided grows (:func:`analysis.power.judge`) until every cell is decided
    or capped; ``run_once(config, argv, keep)`` runs one invocation of the runs ``keep(spec)`` selects, without a
    plan. A cell is its values of the other factors, matched by the arm rule (``same_arm``)."""
    sweep_dir = Path(config.root) / config.name
    pilot, rounds = tuple(config.seeds), []
    sizes: list[tuple[dict[str, Any], int]] = []  # (cell, its seeds) as the looks grew them
    once = dataclasses.replace(config, target_mde=None, max_seeds=None, report=False)

    def size_of(factors: Mapping[str, Any]) -> int:
        return max((size for cell, size in sizes if all(same_arm(factors.get(key), value)
                                                         for key, value in cell.items())), default=len(pilot))

    def seeds_of(factors: Mapping[str, Any]) -> tuple[int, ...]:
        return seed_order(pilot, size_of(factors))

    def all_seeds() -> tuple[int, ...]:
        return seed_order(pilot, max([len(pilot), *(size for _, size in sizes)]))

    while True:
        code = run_once(dataclasses.replace(once, seeds=all_seeds()), argv, lambda spec: spec.seed in
                        seeds_of(spec.factors))
        if code:
            print(f"a look's runs did not complete (exit status {code}); no more seeds were planned", flush=True)
            return code
        try:
            cell_keys, comparisons = look(sweep_dir, config.plan_metric, seeds_of)
            cells = judge_cells(comparisons, cell_keys, config.target_mde, plan_cap(config))
            short = [cell for cell in cells if cell["seeds"] < size_of(cell["cell"])]
            if short:
                raise ValueError(f"the cell {short[0]['cell']} has {short[0]['seeds']} paired seeds of the "
                                 f"{size_of(short[0]['cell'])} planned; its runs are missing from the record")
        except ValueError as error:
            print(f"error: no seed plan: {error}", flush=True)
            return 2
        rounds.append(cells)
        record = plan_record(config, pilot, cell_keys, rounds)
        save_plan(sweep_dir, record)  # sweep.json keeps it in later invocations
        print(describe_look(record), flush=True)
        grown = [(cell["cell"], cell["seeds_next"]) for cell in cells if cell["seeds_next"] > cell["seeds"]]
        if not grown:
            break
        sizes += grown
    return run_once(dataclasses.replace(once, seeds=all_seeds(), report=config.report), argv,
                    lambda spec: spec.seed in seeds_of(spec.factors))


def judge_cells(comparisons: Sequence[dict[str, Any]], cell_keys: Sequence[str], target_mde: float,
                max_seeds: int) -> list[dict[str, Any]]:
    """One entry per cell: its values, seeds (the fewest pairs of its comparisons), seeds next (the most any of its
    comparisons asks for) and its comparisons, each with its ``decision`` and ``seeds_next``."""
    if not comparisons:
        raise ValueError("a seed plan needs at least one group besides the baseline")
    cells: dict[str, dict[str, Any]] = {}
    for comparison in comparisons:
        comparison["decision"], comparison["seeds_next"] = judge(comparison, target_mde, max_seeds)
        values = {key: comparison["group"][key] for key in cell_keys}
        cell = cells.setdefault(json.dumps(values, sort_keys=True), {"cell": values, "seeds": comparison["n_pairs"],
                                                                     "seeds_next": 0, "comparisons": []})
        cell["comparisons"].append(comparison)
        cell["seeds"] = min(cell["seeds"], comparison["n_pairs"])
        cell["seeds_next"] = max(cell["seeds_next"], comparison["seeds_next"])
    return list(cells.values())


def plan_record(config: Any, pilot: Sequence[int], cell_keys: Sequence[str],
                rounds: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """``sweep.json``'s ``plan``: the rule's settings, the pilot, and every look's cells (docs/sweeps.md)."""
    return {"metric": config.plan_metric, "target_mde": config.target_mde, "max_seeds": plan_cap(config),
            "power": DEFAULT_POWER, "level": DEFAULT_LEVEL, "interim_level": INTERIM_LEVEL, "growth": GROWTH,
            "pilot_seeds": list(pilot), "cell_keys": list(cell_keys), "looks": [list(cells) for cells in rounds]}


def describe_look(plan: Mapping[str, Any]) -> str:
    """One line per cell of the last look: its seeds, each comparison's MDE and decision, and what comes next."""
    lines = [f"seed plan for {plan['metric']}, look {len(plan['looks'])}: target MDE {plan['target_mde']:g}, at most "
             f"{plan['max_seeds']} seeds per cell"]
    for cell in plan["looks"][-1]:
        where = ", ".join(f"{key}={value}" for key, value in cell["cell"].items()) or "the grid"
        judged = "; ".join(f"{comparison['decision']} (" + (
            "no spread: every paired difference is the same, so an MDE cannot be judged" if
            comparison["std_difference"] == 0 else f"MDE {comparison['mde']:.4g}") + ")"
            for comparison in cell["comparisons"])
        after = f"grows to {cell['seeds_next']} seeds" if cell["seeds_next"] > cell["seeds"] else "done"
        lines.append(f"  {where}: {cell['seeds']} seeds: {judged}; {after}")
    return "\n".join(lines)
