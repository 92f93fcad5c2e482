"""Sweep throughput: ``jobs=1`` against ``jobs=cores`` through the real sweep driver, runs of the default sweep's
length: RL steps and runs per hour, parallel efficiency (what it holds fixed: docs/performance.md)."""

from __future__ import annotations

import contextlib
import io
import itertools
import tempfile
from pathlib import Path

from benchmarks.common import Row, interleaved, min_median, options, printed
from sweeps.backends.local import LocalSettings
from sweeps.cli import main as sweep_main
from sweeps.sweep_config import available_cores


def main(argv=None) -> list[Row]:
    args = options(__doc__, argv, steps=(LocalSettings.steps, "RL steps per run"), rounds=2,
                   out=(None, "folder for the sweeps (default: a temp folder)"))
    cores, names = available_cores(), itertools.count()
    alphas = ",".join(f"{0.1 * index:.1f}" for index in range(cores))
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        root = args.out or Path(scratch)

        def sweep(jobs: int, alphas: str = alphas, steps: int = args.steps, name: str | None = None) -> None:
            """One whole sweep (driver and runs), its output silenced."""
            name = name or f"jobs{jobs}-{next(names)}"
            with contextlib.redirect_stdout(io.StringIO()):
                code = sweep_main([f"alpha={alphas}", "seeds=1", f"jobs={jobs}", "threads=1", f"steps={steps}",
                                   f"root={root}", f"name={name}", "add_baseline=false", "report=false"])
            if code != 0:
                raise RuntimeError(f"sweep {name} exited with {code}; see {root / name / 'logs'}")

        sweep(1, "0.5", 1, "warmup")  # the SFT cache (the default one), imports, page cache
        times = interleaved({"1": lambda: sweep(1), "cores": lambda: sweep(cores)}, rounds=args.rounds, warmup=0)
    one, many = ([cores * args.steps * 3600 / seconds for seconds in times[side]] for side in ("1", "cores"))
    efficiency = [m / o / cores for m, o in zip(sorted(many), sorted(one), strict=True)]
    return printed([
        Row("sweep", f"RL steps per hour: jobs=1 -> jobs={cores}", "steps/h", min_median(one), min_median(many),
            note=f"{cores} runs of {args.steps} steps, 1 thread each"),
        Row("sweep", f"{args.steps}-step runs per hour: jobs=1 -> jobs={cores}", "runs/h",
            min_median(one, 1 / args.steps), min_median(many, 1 / args.steps), note="process start-up included"),
        Row("sweep", "parallel efficiency (speed-up / jobs)", "", None, min_median(efficiency),
            note="<= 1 by construction; rounds paired by rank")])


if __name__ == "__main__":
    main()
