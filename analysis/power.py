"""Report sections on what a sweep can tell (detectable differences, evaluation against training noise, the seed
plan); each writes Markdown lines through ``add(*lines)``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.aggregate import default_baseline, paired_differences
from analysis.groups import group_text, matching_rows
from analysis.load import add_run_columns
from analysis.statistics import (DEFAULT_CONFIDENCE, DEFAULT_LEVEL, DEFAULT_POWER, MIN_SEEDS_FOR_INTERVAL,
                                 minimum_detectable_effect, seeds_needed, stein_seeds_needed, stein_two_stage,
                                 variance_split)

Add = Callable[..., None]
EVAL_SHARE_TARGET = 0.25  # evaluation noise should be at most a quarter of the between-seed variance
VAL_SIZE_COLUMN = "config.trainer.val_size"
TEST_SIZE_COLUMN = "config.task.test_size"


def power_section(add: Add, summaries: pd.DataFrame, metric: str, group_keys: Sequence[str], target: float,
                  confidence: float = DEFAULT_CONFIDENCE) -> None:
    """One sentence per comparison against the baseline."""
    rows = summaries[summaries["metric"].astype(str) == metric]
    baseline = default_baseline(rows, group_keys)
    add("## What this sweep can detect", "")
    if baseline is None:
        add("No single baseline group: no comparison to size.", "")
        return
    deltas = paired_differences(rows, group_keys=group_keys, baseline=baseline, confidence=confidence,
                                n_bootstrap=100)
    add(f"`{metric}` (final-window mean), paired by seed, {DEFAULT_POWER:.0%} power at a two-sided "
        f"{DEFAULT_LEVEL:g} level, taking the observed spread of the paired differences for the true one. The seeds "
        f"a difference needs are therefore a plug-in figure; a seed plan (`TARGET_MDE`) pays for not knowing the "
        f"spread with Stein's rule and asks for more:", "")
    for _, row in deltas.iterrows():
        n, std = int(row["n_pairs"]), float(row["std_difference"])
        needed = None if n < 2 or not np.isfinite(std) else seeds_needed(std, target) if std > 0 else 2
        add(f"- {group_text({key: row[key] for key in group_keys})} against the baseline: " + (
            f"{n} seed pair(s): no spread to judge from; run at least {MIN_SEEDS_FOR_INTERVAL} seeds"
            if n < 2 or not np.isfinite(std) else f"with {n} seeds this sweep can detect |Δ| >= {row['mde']:.4f}; to "
            f"detect {target:g} you need {'more than 100000' if needed is None else needed} seeds") + ".")
    add("")


def variance_split_table(summaries: pd.DataFrame, runs: pd.DataFrame, metric: str,
                         group_keys: Sequence[str]) -> pd.DataFrame:
    """Per group: the between-seed SD of an accuracy ``metric``, its evaluation and training parts and their share."""
    rows = summaries[summaries["metric"].astype(str) == metric]
    # validation items per run: min(trainer.val_size, task.test_size)
    items = pd.to_numeric(runs[VAL_SIZE_COLUMN], errors="coerce")
    if TEST_SIZE_COLUMN in runs.columns:
        items = np.fmin(items, pd.to_numeric(runs[TEST_SIZE_COLUMN], errors="coerce"))
    rows = add_run_columns(rows, runs.assign(val_items=items.to_numpy(dtype=np.float64)), ["val_items"])
    records = []
    for key, group in rows.groupby(list(group_keys), sort=True, dropna=False):
        values = group["final_window"].to_numpy(dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size < 2:
            continue
        p, variance = float(values.mean()), float(values.var(ddof=1))
        val_items = float(group["val_items"].mean())
        split = variance_split(p, variance, val_items)
        records.append({**dict(zip(group_keys, key, strict=True)), "n": int(values.size), "mean": p,
                        "val_items": val_items, "between_seed_sd": float(np.sqrt(variance)),
                        "eval_sd": float(np.sqrt(split["eval_variance"])),
                        "training_sd": float(np.sqrt(split["training_variance"])),
                        "eval_share": split["eval_share"]})
    return pd.DataFrame.from_records(records)


def variance_section(add: Add, summaries: pd.DataFrame, runs: pd.DataFrame, metric: str,
                     group_keys: Sequence[str]) -> None:
    if not metric.startswith("val/accuracy") or VAL_SIZE_COLUMN not in runs.columns:
        return
    table = variance_split_table(summaries, runs, metric, group_keys)
    add("## Evaluation noise against training noise", "")
    if table.empty:
        add("Needs at least 2 seeds per group.", "")
        return
    add(f"Each group's between-seed variance of `{metric}` (final-window mean) split into evaluation noise, the "
        "binomial variance p(1-p)/N of an accuracy p measured on N validation items, and training noise, the rest "
        "(floored at 0): the RL seed's, and with a warm start per seed the warm start's draw too. Evaluation noise "
        f"should be at most {EVAL_SHARE_TARGET:.0%} of the between-seed variance.", "")
    shown = table.assign(**{column: [f"{value:.4f}" for value in table[column]]
                            for column in ("mean", "between_seed_sd", "eval_sd", "training_sd")},
                         eval_share=[f"{value:.0%}" if np.isfinite(value) else "n/a" for value in table["eval_share"]],
                         val_items=[f"{value:g}" for value in table["val_items"]])
    add(shown.to_markdown(index=False), "")
    over = table[(table["eval_share"] > EVAL_SHARE_TARGET) & (table["eval_share"] <= 1.0)]
    if (table["eval_share"] > 1.0).any():
        add("Where the binomial variance exceeds the observed between-seed variance (share above 100%), the seeds "
            "agree more closely than independent draws of the validation items would: every seed is evaluated on the "
            "same items, so the item-sampling part of the evaluation noise is shared by all seeds, shifts every group "
            "alike and cancels in the paired differences. The binomial figure bounds the noise of an absolute "
            "accuracy; the paired intervals and MDEs above already contain whatever evaluation noise the differences "
            "carry.", "")
    if len(over):
        add(f"In {len(over)} of {len(table)} group(s) evaluation noise exceeds {EVAL_SHARE_TARGET:.0%} of the "
            "between-seed variance: more validation items (`trainer.val_size`, at most `task.test_size`) would "
            "sharpen these comparisons.", "")
    elif (table["eval_share"] <= EVAL_SHARE_TARGET).all():
        add(f"Evaluation noise is at most {EVAL_SHARE_TARGET:.0%} of the between-seed variance in every group.", "")


# The rule's constants (docs/sweeps.md, "How many seeds"): a cell still undecided grows at least this much per look,
# and a look stops a cell early only when its interval at this level excludes 0 (a Haybittle-Peto boundary).
GROWTH = 1.5
INTERIM_LEVEL = 0.001


def seed_order(pilot: Sequence[int], count: int) -> tuple[int, ...]:
    """The first ``count`` seeds of a plan: the pilot's, then the next integers after its largest."""
    return (*pilot, *range(max(pilot) + 1, max(pilot) + 1 + count - len(pilot)))[:max(count, len(pilot))]


def judge(comparison: Mapping[str, Any], target_mde: float, max_seeds: int) -> tuple[str, int]:
    """``(decision, seeds next)`` of one comparison at a look: ``precise`` (MDE <= target), ``effect`` (the interval
    at :data:`INTERIM_LEVEL` excludes 0), ``capped`` (``max_seeds`` reached), else ``grow`` to Stein's need from
    the current spread, at least :data:`GROWTH` times the seeds, at most ``max_seeds``."""
    n, mean, std = int(comparison["n_pairs"]), float(comparison["mean_difference"]), float(comparison["std_difference"])
    if not math.isfinite(std):
        raise ValueError(f"a comparison has no spread (std = {std!r}): a look needs >= 2 paired seeds")
    if std == 0:  # identical differences: no spread to plan from, and more seeds of the same kind add none
        return "no spread", n
    if minimum_detectable_effect(std, n) <= target_mde:
        return "precise", n
    if abs(mean) > stats.t.ppf(1.0 - INTERIM_LEVEL / 2.0, n - 1) * std / math.sqrt(n):
        return "effect", n
    if n >= max_seeds:
        return "capped", n
    return "grow", min(max_seeds, max(stein_seeds_needed(std, n, target_mde), math.ceil(GROWTH * n)))


def plan_section(add: Add, plan: Mapping[str, Any], summaries: pd.DataFrame, group_keys: Sequence[str],
                 confidence: float = DEFAULT_CONFIDENCE) -> None:
    """The plan recorded in ``sweep.json`` (each look's cells), and Stein's test of each planned comparison."""
    pilot = [int(seed) for seed in plan["pilot_seeds"]]
    last = plan["looks"][-1]
    add("## Seed plan", "",
        f"Planned for `{plan['metric']}` (final-window mean) from a pilot of seeds {pilot}: at each look, a cell of "
        f"the other factors ({', '.join(plan['cell_keys']) or 'the whole grid'}) is done when every comparison in it "
        f"has an MDE of at most {plan['target_mde']:g} ({plan['power']:.0%} power, two-sided {plan['level']:g}), "
        f"or its {1 - plan['interim_level']:.1%} paired interval excludes 0, or it has {plan['max_seeds']} seeds; "
        f"otherwise it grows to the seeds Stein's rule asks from its current spread, at least {plan['growth']:g} "
        "times as many. Each decision reads the spread or a 99.9% interval, never the 95% one. The tables' paired t "
        "over all seeds is then slightly liberal (up to 8% false positives at a nominal 5%, simulated in "
        "tests/sweeps/test_sweep_planning.py); Stein's test below takes its spread from the pilot alone and keeps "
        "its level whatever the looks decided.", "")
    looks = [{json.dumps(cell["cell"], sort_keys=True): cell for cell in cells} for cells in plan["looks"]]
    rows = []
    for cell in last:
        key = json.dumps(cell["cell"], sort_keys=True)
        sizes = [str(look[key]["seeds"]) for look in looks if key in look]
        rows.append({**cell["cell"], "seeds at each look": " -> ".join(sizes),
                     "decision": ", ".join(sorted({c["decision"] for c in cell["comparisons"]}))})
    add(pd.DataFrame.from_records(rows).to_markdown(index=False), "")
    metric_rows = summaries[summaries["metric"].astype(str) == plan["metric"]]
    baseline = default_baseline(metric_rows, group_keys)
    if baseline is None:
        return
    for cell in last:
        in_cell = metric_rows[matching_rows(metric_rows, cell["cell"])]
        is_baseline = matching_rows(in_cell, {**cell["cell"], **baseline})
        reference = in_cell[is_baseline].set_index("seed")["final_window"]
        for key, group in in_cell[~is_baseline].groupby(list(group_keys), sort=True, dropna=False):
            values = group.set_index("seed")["final_window"]
            seeds = [s for s in seed_order(pilot, cell["seeds"]) if s in values.index and s in reference.index]
            label = group_text(dict(zip(group_keys, key, strict=True)))
            if seeds[:len(pilot)] != pilot:
                add(f"- {label}: pilot seeds missing from the completed runs; no planned test.")
                continue
            test = stein_two_stage([values[s] - reference[s] for s in seeds], len(pilot), confidence)
            add(f"- {label}: Stein's test over {test['n']} seeds: Δ {test['mean_difference']:+.4f} "
                f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}], p={test['p_value']:.3f}")
    add("")
