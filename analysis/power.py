"""Report sections on what a sweep can tell (detectable differences, evaluation against training noise, the seed
plan); each writes Markdown lines through ``add(*lines)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.aggregate import default_baseline, paired_differences
from analysis.groups import group_text, matching_rows
from analysis.load import add_run_columns
from analysis.statistics import (
    DEFAULT_CONFIDENCE,
    DEFAULT_LEVEL,
    DEFAULT_POWER,
    MIN_SEEDS_FOR_INTERVAL,
    seeds_needed,
    stein_two_stage,
    variance_split,
)

Add = Callable[..., None]
EVAL_SHARE_TARGET = 0.25  # evaluation noise should be at most a quarter of the between-seed variance
VAL_SIZE_COLUMN = "config.trainer.val_size"
TEST_SIZE_COLUMN = "config.task.test_size"


def detectable_sentence(n: int, std: float, mde: float, target: float) -> str:
    if n < 2 or not np.isfinite(std):
        return f"{n} seed pair(s): no spread to judge from; run at least {MIN_SEEDS_FOR_INTERVAL} seeds"
    needed = seeds_needed(std, target) if std > 0 else 2
    needed_text = "more than 100000" if needed is None else str(needed)
    return f"with {n} seeds this sweep can detect |Δ| >= {mde:.4f}; to detect {target:g} you need {needed_text} seeds"


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
        add(f"- {group_text({key: row[key] for key in group_keys})} against the baseline: "
            + detectable_sentence(int(row["n_pairs"]), float(row["std_difference"]), float(row["mde"]), target)
            + ".")
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


def plan_section(add: Add, plan: Mapping[str, Any], summaries: pd.DataFrame, group_keys: Sequence[str],
                 confidence: float = DEFAULT_CONFIDENCE) -> None:
    """The plan recorded in ``sweep.json``, and Stein's two-stage test of each planned comparison."""
    text = (f"seed plan for {plan['metric']}: the pilot ({len(plan['pilot_seeds'])} seeds) needs {plan['seeds_needed']} "
            f"seeds to detect |Δ| >= {plan['target_mde']:g} with {plan.get('power', DEFAULT_POWER):.0%} power at a "
            f"two-sided {plan.get('level', DEFAULT_LEVEL):g} level; planned {len(plan['seeds'])} seeds")
    if plan.get("capped"):
        text += f" (capped by max_seeds = {plan['max_seeds']})"
    add("## Seed plan", "", text + f", expected MDE {plan['expected_mde']:.4f}.", "",
        f"Pilot seeds {plan['pilot_seeds']}; all planned seeds {plan['seeds']}. The planned test is Stein's two-stage "
        "t (the spread comes from the pilot alone, so its level is exact however many seeds the plan chose); the "
        "tables' paired t over all seeds is slightly liberal after a plan.", "")
    rows = summaries[summaries["metric"].astype(str) == plan["metric"]]
    baseline = default_baseline(rows, group_keys)
    if baseline is None:
        return
    order = [int(seed) for seed in plan["seeds"]]
    is_baseline = matching_rows(rows, baseline)
    reference = rows[is_baseline].set_index("seed")["final_window"]
    for key, group in rows[~is_baseline].groupby(list(group_keys), sort=True, dropna=False):
        values = group.set_index("seed")["final_window"]
        seeds = [s for s in order if s in values.index and s in reference.index]
        pilot = [s for s in plan["pilot_seeds"] if s in seeds]
        label = group_text(dict(zip(group_keys, key, strict=True)))
        if len(pilot) < 2 or len(pilot) != len(plan["pilot_seeds"]):
            add(f"- {label}: pilot seeds missing from the completed runs; no planned test.")
            continue
        differences = [values[s] - reference[s] for s in seeds]
        test = stein_two_stage(differences, len(pilot), confidence)
        add(f"- {label}: planned test over {test['n']} seeds: Δ {test['mean_difference']:+.4f} "
            f"[{test['ci_low']:+.4f}, {test['ci_high']:+.4f}], p={test['p_value']:.3f}")
    add("")
