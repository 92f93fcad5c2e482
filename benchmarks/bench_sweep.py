"""Parallel efficiency of the sweep driver: two runs one after the other versus the same two runs at once.

- sequential: two 1-run sweeps (``jobs=1``, so each run gets every core as threads) run one after the other;
  ``t_sequential`` is the sum of their times;
- parallel: one sweep holding both runs with ``jobs=2`` (each run ``cores // 2`` threads); ``t_parallel``.

``speedup = t_sequential / t_parallel`` and ``efficiency = speedup / 2`` (1.0: two runs cost the time of one;
target >= 0.8 on 2 cores). Each sweep is timed whole, driver included, in this process after a warm-up sweep that
builds the SFT cache and imports everything, so no side pays a one-off cost. Real runs of the local trainer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

from sweeps.cli import main as sweep_main
from sweeps.config import available_cores


def run_sweep(root: Path, name: str, alphas: str, jobs: int, steps: int, extra: str, add_baseline: bool) -> float:
    """Seconds for one whole sweep (driver and runs), its output silenced."""
    argv = [f"alpha={alphas}", "seeds=1", f"jobs={jobs}", f"steps={steps}", f"root={root}", f"name={name}",
            f"add_baseline={str(add_baseline).lower()}", "report=false", extra]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = sweep_main(argv)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"sweep {name} exited with {code}; see {root / name / 'logs'}")
    return elapsed


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="RL steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; each figure keeps its best round")
    parser.add_argument("--out", type=Path, default=None, help="folder for the sweeps (default: a temp folder)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        root = args.out or Path(scratch)
        overrides = ["trainer.val_every=5", "trainer.prompts_per_step=8", "trainer.rollouts_per_prompt=4",
                     "trainer.val_size=32", "trainer.save_every=10", "sft.steps=20", "logger.wandb.mode=disabled",
                     "stats.exact_every=0", f"sft.cache_dir={root / 'sft-cache'}"]
        extra = "extra=[" + " ".join(overrides) + "]"
        run_sweep(root, "warmup", "0.25", 1, 1, extra, add_baseline=False)  # SFT cache, imports, page cache
        # Interleave the rounds so machine noise hits both sides alike; keep each side's best round.
        rounds: dict[str, list[float]] = {"a": [], "b": [], "parallel": []}
        for index in range(args.repeats):
            rounds["a"].append(run_sweep(root, f"sequential-a-{index}", "0.0", 1, args.steps, extra, False))
            rounds["b"].append(run_sweep(root, f"sequential-b-{index}", "0.5", 1, args.steps, extra, False))
            rounds["parallel"].append(run_sweep(root, f"parallel-{index}", "0.0,0.5", 2, args.steps, extra, False))
    sequential = [min(rounds["a"]), min(rounds["b"])]
    parallel = min(rounds["parallel"])
    t_sequential = sum(sequential)
    speedup = t_sequential / parallel
    efficiency = speedup / 2
    cores = available_cores()
    print(f"sweep parallel efficiency, 2 real runs of {args.steps} steps, {cores} cores, best of {args.repeats}:")
    print(f"  sequential (jobs=1, {cores} threads each)  {sequential[0]:7.1f} s + {sequential[1]:7.1f} s = "
          f"{t_sequential:7.1f} s")
    print(f"  parallel   (jobs=2, {max(1, cores // 2)} thread(s) each) {parallel:7.1f} s")
    print(f"  speedup {speedup:.2f}x, efficiency {efficiency:.2f} (target >= 0.80)")
    if efficiency > 1:
        print("  (above 1: a lone run gained nothing from its extra threads at this model size, so two 1-thread "
              "runs side by side beat two multi-thread runs in a row)")
    return {"t_sequential_s": t_sequential, "t_parallel_s": parallel, "speedup": speedup, "efficiency": efficiency}


if __name__ == "__main__":
    main()
