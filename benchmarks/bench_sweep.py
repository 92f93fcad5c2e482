"""Sweep throughput: ``jobs=1`` against ``jobs=cores`` through the real sweep driver: RL steps and runs per hour,
parallel efficiency."""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, format_table, min_median
from sweeps.cli import main as sweep_main
from sweeps.sweep_config import available_cores

DEFAULT_RUN_STEPS = 400


def run_sweep(root: Path, name: str, alphas: str, jobs: int, steps: int) -> float:
    """Seconds for one whole sweep (driver and runs), its output silenced."""
    argv = [f"alpha={alphas}", "seeds=1", f"jobs={jobs}", "threads=1", f"steps={steps}", f"root={root}",
            f"name={name}", "add_baseline=false", "report=false"]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = sweep_main(argv)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"sweep {name} exited with {code}; see {root / name / 'logs'}")
    return elapsed


def main(argv=None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=15, help="RL steps per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="folder for the sweeps (default: a temp folder)")
    args = parser.parse_args(argv)
    cores = available_cores()
    alphas = ",".join(f"{0.1 * index:.1f}" for index in range(cores))
    times: dict[int, list[float]] = {1: [], cores: []}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        root = args.out or Path(scratch)
        run_sweep(root, "warmup", "0.5", 1, 1)  # SFT cache (the default one), imports, page cache
        for index in range(args.rounds):
            for jobs in ((1, cores) if index % 2 == 0 else (cores, 1)):
                times[jobs].append(run_sweep(root, f"jobs{jobs}-{index}", alphas, jobs, args.steps))
    one, many = ([cores * args.steps * 3600 / value for value in times[jobs]] for jobs in (1, cores))
    efficiency = [m / o / cores for m, o in zip(sorted(many), sorted(one))]
    note = f"{cores} runs of {args.steps} steps, 1 thread each"
    rows = [Row("sweep", f"RL steps per hour: jobs=1 -> jobs={cores}", "steps/h", min_median(one), min_median(many),
                note=note),
            Row("sweep", f"default {DEFAULT_RUN_STEPS}-step runs per hour: jobs=1 -> jobs={cores}", "runs/h",
                min_median([value / DEFAULT_RUN_STEPS for value in one]),
                min_median([value / DEFAULT_RUN_STEPS for value in many]), note="extrapolated from the short runs"),
            Row("sweep", "parallel efficiency (speed-up / jobs)", "", None, min_median(efficiency),
                note="<= 1 by construction; rounds paired by rank")]
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
