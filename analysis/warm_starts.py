"""What a sweep's intervals cover: its warm-start design and the warm starts' spread (docs/analysis.md)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.frames import SweepData
from dataflex_rl import keys


def warm_start_design(data: SweepData) -> str | None:
    """``per_seed`` or ``shared``: ``sweep.json``'s, else the one the runs recorded; None when unknown or mixed."""
    recorded = (data.manifest or {}).get("warm_start")
    if recorded:
        return str(recorded)
    designs = set(data.included_runs.get("warm_start_design", pd.Series(dtype=object)).dropna())
    return designs.pop() if len(designs) == 1 else None


def warm_start_table(data: SweepData, metric: str = keys.VAL_ACCURACY) -> pd.DataFrame:
    """One row per warm start of the included runs: SFT seed, checkpoint, runs, seeds and ``metric`` at step 0."""
    runs = data.included_runs
    if "warm_start_design" not in runs or runs[["warm_start", "warm_start_design"]].isna().all(axis=None):
        return pd.DataFrame()
    # without SFT (sft.steps=0) a run starts from the model as built from sft.seed: that is its warm start
    built = "model as built, sft.seed=" + runs["warm_start_seed"].astype("Int64").astype(str)
    runs = runs.assign(warm_start=runs["warm_start"].where(runs["warm_start"].notna(), built).astype(str))
    rows = data.metrics
    at_start = rows[(rows["metric"].astype(str) == metric).to_numpy() & (rows["step"] == 0).to_numpy()]
    start_values = at_start.groupby(at_start["run"].astype(str), observed=True)["value"].mean()
    table = []
    for checkpoint, group in runs.groupby("warm_start", sort=False):
        values = start_values.reindex(group["run"].astype(str)).dropna()
        seeds = sorted(int(seed) for seed in group["seed"].dropna())
        sft_seeds = group["warm_start_seed"].dropna()
        first = group.iloc[0]
        table.append({"warm start": checkpoint.rstrip("/").rsplit("/", 1)[-1],
                      "sft.seed": int(sft_seeds.iloc[0]) if len(sft_seeds) else None,
                      "runs": len(group), "seeds": ", ".join(map(str, dict.fromkeys(seeds))),
                      "SFT steps": first.get("warm_start_steps"), "stopping rule": stopping_outcome(first),
                      f"{metric} after SFT": float(values.mean()) if len(values) else np.nan})
    table = pd.DataFrame(table).sort_values("sft.seed", na_position="last", ignore_index=True)
    table["SFT steps"] = pd.to_numeric(table["SFT steps"]).astype("Int64")
    unrecorded = [column for column in ("SFT steps", "stopping rule") if table[column].isna().all()]
    return table.drop(columns=unrecorded)


def stopping_outcome(run: pd.Series) -> str | None:
    """A warm start's stopping rule as it ended: the check that reached the target, or the target never reached."""
    target = run.get("warm_start_target")
    if target is None or pd.isna(target):
        return None
    check = run.get("warm_start_check")
    last = "no check" if check is None or pd.isna(check) else f"last check {check:.3f}"
    if run.get("warm_start_reached") in (True, 1):  # a bool, or numpy's in a pandas column
        return f"reached: check {check:.3f} >= target {target:.3f}"
    return f"target {target:.3f} NOT reached ({last})"


def _spread(values: pd.Series) -> str:
    values = values.dropna()
    if len(values) == 0:
        return ""
    if len(values) == 1:
        return f"{values.iloc[0]:.3f}"
    return f"{values.min():.3f} to {values.max():.3f}, SD {values.std(ddof=1):.3f}"


def design_sentence(data: SweepData, metric: str = keys.VAL_ACCURACY) -> str:
    """The sweep's design, the sources of variation its intervals include and leave out, the warm starts' spread."""
    design = warm_start_design(data)
    table = warm_start_table(data, metric)
    count = len(table)
    counted = f"{count} warm start{'' if count == 1 else 's'}"
    spread = _spread(table[f"{metric} after SFT"]) if count else ""
    after = f"; {metric} after SFT {spread}" if spread else ""
    sizes = set(data.included_runs.get("config.trainer.val_size", pd.Series(dtype=object)).dropna())
    problems = f"the same {int(sizes.pop())} held-out problems" if len(sizes) == 1 else "the same held-out problems"
    items = (f"They leave out the choice of evaluation items: every run is scored on {problems}, "
             "a noise that is shared and cancels in the paired deltas.")
    if design == "per_seed":
        return (f"Design: each seed its own SFT warm start (warm_start=per_seed: {counted}, sft.seed = "
                f"the seed, the same for every arm of a seed{after}). The intervals over seeds include the RL "
                f"seed and the warm start's draw: they answer for the recipe. {items}")
    if design == "shared":
        seeds = table["sft.seed"].dropna() if count else pd.Series(dtype=float)
        which = f"sft.seed = {int(seeds.iloc[0])}" if len(seeds) == 1 else counted
        return (f"Design: one SFT warm start shared by every run (warm_start=shared: {which}{after}). The "
                f"intervals include the RL seed only, so the result holds for this warm start only; another SFT "
                f"draw moves the starting point (warm_start=per_seed answers for the recipe). {items}")
    recorded = f"{counted}{after}" if count else "the runs record no warm start"
    return (f"Design: not recorded ({recorded}). The intervals include the variation between the runs' seeds as "
            f"they were run. {items}")
