"""Where a sweep's time goes, and what fewer steps or seeds would buy: ``python -m analysis.timing runs/<sweep>
[--name <name>]`` (with ``--name``, written as ``docs/results/<name>.md``).

The split: its processes' seconds by stage, each process one thread on one core: a run's wall time (``sweep.json``)
split by its ``timing_s/*`` metrics, a warm start's by its ``done.json`` training seconds; the driver's own time is
the sweep's wall time when none of its processes ran (the report, written after the invocation ends, is not in it).
The trade-off: the paired delta's MDE had the runs stopped at an earlier step (exact: a run's first S steps are what
a run of S steps does, the learning rate being constant, where S is an evaluation step) and with other seed counts
(projected from the measured spread), against the sweep's minutes from the split's costs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.aggregate import (DEFAULT_FINAL_WINDOW, default_baseline, default_group_keys, paired_differences,
                                run_summaries)
from analysis.frames import SweepData
from analysis.load import load_sweep
from analysis.statistics import minimum_detectable_effect
from dataflex_rl import keys
from dataflex_rl.tracking.run_store import COMPLETED
from dataflex_rl.tracking.run_store.files import read_json_object
from dataflex_rl.tracking.run_store.schema import SFT_DONE_FILE

# The stages, in a run's order; a run's seconds outside its timed parts are "run: finish and launch".
SFT_STARTUP, SFT_TRAINING = "warm start: process start-up and save", "warm start: SFT training and its checks"
RUN_STARTUP = "run: process start-up (imports, config, warm-start load, loggers)"
ROLLOUT, STEP_REST = "rollout (sampling)", "reward, advantages, old log-probs"
MECHANISM, UPDATE = "mechanism and its statistics", "update (loss, backward, optimizer)"
EVALUATION, LOGGING, RUN_REST = "evaluation (greedy validation)", "logging (run store, W&B)", "run: finish and launch"
DRIVER = "driver alone, inside its invocation (the closing tables and report come after it)"
STAGES = (SFT_STARTUP, SFT_TRAINING, RUN_STARTUP, ROLLOUT, STEP_REST, MECHANISM, UPDATE, EVALUATION, LOGGING,
          RUN_REST, DRIVER)
STEP_PARTS = {keys.TIMING_GEN: ROLLOUT, keys.TIMING_MECHANISM: MECHANISM, keys.TIMING_EXACT_GRAD: MECHANISM,
              keys.TIMING_PROB_CHANGE: MECHANISM, keys.TIMING_UPDATE: UPDATE}


def _interval(entry: Mapping) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    if not entry.get("start") or not entry.get("end"):
        return None
    return pd.Timestamp(entry["start"]), pd.Timestamp(entry["end"])


def _union_seconds(intervals: Sequence[tuple[pd.Timestamp, pd.Timestamp]], within: tuple) -> float:
    """Seconds of ``within`` covered by at least one of ``intervals``."""
    clipped = sorted((max(start, within[0]), min(end, within[1])) for start, end in intervals)
    total, current = 0.0, None
    for start, end in clipped:
        if end <= start:
            continue
        if current is None or start > current[1]:
            total += 0.0 if current is None else (current[1] - current[0]).total_seconds()
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (0.0 if current is None else (current[1] - current[0]).total_seconds())


def _sft_seconds(entry: Mapping, checkpoints: Sequence[str], sweep_dir: Path) -> float:
    """The training seconds of a warm start this entry built (0 when it found its checkpoint cached). A relative
    checkpoint path (``sft.cache_dir`` is relative by default) is taken from the folder the sweep's ``runs`` root is
    in (where ``make sweep`` ran), else from this one."""
    interval = _interval(entry)
    for checkpoint in checkpoints:
        path = sweep_dir.resolve().parent.parent / checkpoint / SFT_DONE_FILE  # an absolute checkpoint stays itself
        if not path.is_file():
            path = Path(checkpoint) / SFT_DONE_FILE
        if interval is None or not path.is_file():
            continue
        written = pd.Timestamp(path.stat().st_mtime, unit="s", tz="UTC")
        if interval[0] <= written <= interval[1]:
            try:
                return float((read_json_object(path) or {}).get("seconds") or 0.0)
            except (OSError, ValueError, TypeError):  # a damaged done.json: its training time is unknown
                return 0.0
    return 0.0


def _whole(entries: Sequence[Mapping], names: set[str] | None = None) -> list[Mapping]:
    """The entries of processes that completed in one attempt with a wall time (and are in ``names``)."""
    return [entry for entry in entries if entry.get("state") == COMPLETED and entry.get("attempts", 1) == 1
            and entry.get("wall_time_s") is not None and (names is None or entry.get("run") in names)]


def _counted(data: SweepData) -> tuple[list[Mapping], list[Mapping]]:
    """``(warm starts, runs)``: the manifest entries the split counts (whole processes; runs the report includes)."""
    manifest = data.manifest or {}
    return (_whole(manifest.get("warm_starts", [])),
            _whole(manifest.get("runs", []), set(data.included_runs["run"].astype(str))))


def _run_stages(parts: pd.Series, wall: float) -> dict[str, float]:
    """One run's seconds by stage from its summed ``timing_s/*`` metrics and its wall time."""
    part = {metric: float(parts.get(metric, 0.0)) for metric in (*STEP_PARTS, keys.TIMING_STEP, keys.TIMING_VAL,
                                                                 keys.TIMING_LOG, keys.TIMING_STARTUP)}
    stages = dict.fromkeys(STEP_PARTS.values(), 0.0)
    for metric, stage in STEP_PARTS.items():
        stages[stage] += part[metric]
    return {**stages, STEP_REST: part[keys.TIMING_STEP] - sum(part[m] for m in STEP_PARTS),
            RUN_STARTUP: part[keys.TIMING_STARTUP], EVALUATION: part[keys.TIMING_VAL], LOGGING: part[keys.TIMING_LOG],
            RUN_REST: wall - sum(part[m] for m in (keys.TIMING_STEP, keys.TIMING_VAL, keys.TIMING_LOG,
                                                   keys.TIMING_STARTUP))}


def time_split(data: SweepData) -> tuple[pd.DataFrame, dict[str, float]]:
    """``(table, totals)``: seconds per stage (rows in :data:`STAGES` order, with their share of the processes'
    seconds) over the completed single-attempt processes; totals: ``wall``, ``slots`` (jobs x wall), ``processes``,
    ``left_out`` (processes not counted: failed or resumed)."""
    manifest = data.manifest or {}
    seconds = dict.fromkeys(STAGES, 0.0)
    warm_starts, runs = _counted(data)
    for entry in warm_starts:
        seed = entry.get("run", "").removeprefix("sft-seed")
        owners = data.runs[data.runs["warm_start_seed"].astype(str) == seed] if seed.isdigit() else data.runs
        checkpoints = owners["warm_start"].dropna().unique().tolist()
        training = min(_sft_seconds(entry, checkpoints, Path(data.source)), entry["wall_time_s"])
        seconds[SFT_TRAINING] += training
        seconds[SFT_STARTUP] += entry["wall_time_s"] - training
    timing = data.metrics[data.metrics["metric"].astype(str).str.startswith("timing_s/")]
    by_run = timing.groupby(["run", "metric"], observed=True)["value"].sum()
    for entry in runs:
        parts = by_run[entry["run"]] if entry["run"] in by_run.index.get_level_values(0) else pd.Series(dtype=float)
        for stage, value in _run_stages(parts, entry["wall_time_s"]).items():
            seconds[stage] += value
    intervals = [interval for interval in map(_interval, [*warm_starts, *runs]) if interval is not None]
    invocations = [interval for interval in map(_interval, manifest.get("invocations", [])) if interval]
    wall = sum((end - start).total_seconds() for start, end in invocations)
    seconds[DRIVER] = wall - sum(_union_seconds(intervals, invocation) for invocation in invocations)
    table = pd.DataFrame({"stage": list(seconds), "seconds": list(seconds.values())})
    table["share"] = table["seconds"] / table["seconds"].sum()
    left_out = len(manifest.get("warm_starts", [])) + len(manifest.get("runs", [])) - len(warm_starts) - len(runs)
    return table, {"wall": wall, "slots": wall * int(manifest.get("jobs") or 1),
                   "processes": table["seconds"].iloc[:-1].sum(), "left_out": left_out}


def step_costs(data: SweepData, table: pd.DataFrame) -> dict[str, float]:
    """Mean seconds, one core: ``warm_start`` (a whole warm-start process), ``run`` (a run's start-up, finish and
    launch), ``step`` (a training step with its logging) and ``validation`` (one evaluation); ``driver``: its own."""
    seconds = dict(zip(table["stage"], table["seconds"]))
    warm, runs = _counted(data)
    timing = data.metrics[data.metrics["run"].astype(str).isin({e["run"] for e in runs})]
    count = {metric: int((timing["metric"].astype(str) == metric).sum()) for metric in (keys.TIMING_STEP,
                                                                                         keys.TIMING_VAL)}
    per_step = sum(seconds[stage] for stage in (ROLLOUT, STEP_REST, MECHANISM, UPDATE, LOGGING))
    return {"warm_start": (seconds[SFT_STARTUP] + seconds[SFT_TRAINING]) / max(1, len(warm)),
            "run": (seconds[RUN_STARTUP] + seconds[RUN_REST]) / max(1, len(runs)),
            "step": per_step / max(1, count[keys.TIMING_STEP]),
            "validation": seconds[EVALUATION] / max(1, count[keys.TIMING_VAL]), "driver": seconds[DRIVER]}


def tradeoff(data: SweepData, table: pd.DataFrame, seeds: Sequence[int] = (4, 6, 8, 12, 16),
             metric: str = keys.VAL_ACCURACY, final_window: int = DEFAULT_FINAL_WINDOW,
             costs: Mapping[str, float] | None = None) -> pd.DataFrame:
    """One row per (steps, seeds): the largest MDE of the paired deltas of ``metric``'s final window against the
    baseline (measured at the sweep's own seed count, projected at the others from the measured SD) and the
    minutes of such a sweep (its arms, one warm start per seed, ``jobs`` at once, at :func:`step_costs`). Only the
    steps whose final window leaves out the first evaluation: a window holding it averages in the warm start's
    accuracy, the same in every arm, and shrinks every difference with its spread."""
    jobs = int((data.manifest or {}).get("jobs") or 1)
    costs = costs or step_costs(data, table)
    long = data.metrics[data.metrics["metric"].astype(str) == metric]
    group_keys = default_group_keys(data.included_runs)
    long = long.merge(data.included_runs[["run", *[k for k in group_keys if k not in long.columns]]], on="run")
    arms = long[list(group_keys)].drop_duplicates().shape[0]
    evaluated = np.sort(long["step"].unique())
    rows = []
    for steps in evaluated[final_window:]:
        summaries = run_summaries(long[long["step"] <= steps], metrics=[metric], final_window=final_window)
        baseline = default_baseline(summaries, group_keys)
        deltas = paired_differences(summaries, group_keys=group_keys, baseline=baseline)
        measured = deltas.dropna(subset=["std_difference"])
        if measured.empty:
            continue
        spread, measured_n = float(measured["std_difference"].max()), int(measured["n_pairs"].min())
        validations = int((evaluated <= steps).sum())
        run_seconds = costs["run"] + steps * costs["step"] + validations * costs["validation"]
        for n in sorted({*seeds, measured_n}):
            minutes = (n * costs["warm_start"] + n * arms * run_seconds) / jobs / 60 + costs["driver"] / 60
            rows.append({"steps": int(steps), "seeds": n, "mde": minimum_detectable_effect(spread, n),
                         "measured": n == measured_n, "minutes": minutes})
    return pd.DataFrame(rows, columns=["steps", "seeds", "mde", "measured", "minutes"])


def time_split_text(data: SweepData, sweep_dir: Path, name: str | None = None) -> str:
    table, totals = time_split(data)
    jobs = int((data.manifest or {}).get("jobs") or 1)
    lines = [] if name is None else [f"<!-- {name}: written by `python -m analysis.timing {sweep_dir} --name {name}`; "
                                     f"do not edit by hand -->", ""]
    lines += ["| stage | seconds (one core each) | share |", "|---|---:|---:|"]
    lines += [f"| {row.stage} | {row.seconds:.0f} | {row.share:.0%} |" for row in table.itertuples()]
    lines += ["", f"- sweep {sweep_dir.name}: wall time {totals['wall'] / 60:.1f} min with "
              f"{jobs} run(s) at once: its processes used "
              f"{totals['processes'] / totals['slots']:.0%} of the {totals['slots'] / 60:.1f} slot-minutes"
              if totals["slots"] else f"- sweep {sweep_dir.name}: no invocation with an end on record"]
    if totals["left_out"]:
        lines.append(f"- {totals['left_out']} process(es) not counted: not completed, or resumed (their wall time "
                     f"is of the last attempt)")
    costs = step_costs(data, table)
    trade = tradeoff(data, table, costs=costs)
    if len(trade):
        lines += ["", f"What fewer steps or other seed counts would buy ({keys.VAL_ACCURACY}, final window, the paired "
                  f"delta's MDE, at each step whose window of {DEFAULT_FINAL_WINDOW} evaluations leaves out step 0; "
                  f"* measured, else projected from the measured SD; minutes from a warm start of "
                  f"{costs['warm_start']:.0f} s, a run's {costs['run']:.0f} s of start-up and finish, "
                  f"{costs['step']:.2f} s a step and {costs['validation']:.2f} s a validation, one core each, "
                  f"{jobs} at once, "
                  f"and the driver's {costs['driver']:.0f} s):", "",
                  "| steps | " + " | ".join(f"{n} seeds" for n in sorted(trade["seeds"].unique())) + " |",
                  "|---:|" + "---:|" * trade["seeds"].nunique()]
        for steps, rows in trade.groupby("steps"):
            cells = {row.seeds: f"MDE {row.mde:.4f}{'*' if row.measured else ''}, {row.minutes:.1f} min"
                     for row in rows.itertuples()}
            lines.append(f"| {steps} | " + " | ".join(cells.get(n, "") for n in sorted(trade["seeds"].unique()))
                         + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="the sweep folder (runs/<sweep>)")
    parser.add_argument("--name", help="write docs/results/<name>.md (and the docs' blocks that name it)")
    options = parser.parse_args(argv)
    from analysis.results import check_results_name, publish

    if options.name is not None:
        check_results_name(options.name, "--name")
    data = load_sweep(options.sweep_dir, histograms=False, require_runs=True)
    if options.name is None:
        print(time_split_text(data, options.sweep_dir))
        return 0
    path, changed = publish(options.name, lambda: time_split_text(data, options.sweep_dir, options.name))
    print(path.read_text())
    print(f"results: {path}" + (f"; docs updated: {', '.join(map(str, changed))}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
