"""Evaluation cost: a greedy validation of N items against a training step of the default experiment, and the
share of a run's wall time that evaluation takes at the old (256 items every 25 steps) and the default schedule."""

from __future__ import annotations


import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.bench_local import build_trainer
from benchmarks.common import Row, format_table, min_median


def main(argv: list[str] | None = None) -> list[Row]:
    from dataflex_rl.run_config import TrainerConfig

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="256,1024,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        trainer, _ = build_trainer(Path(directory) / "run", [
            f"threads={args.threads}", f"trainer.val_size={max(sizes)}", f"task.test_size={max(*sizes, 256)}",
            "logger.wandb.mode=disabled"])
        pool = trainer.val_problems
        timings: dict[str, list[float]] = {"step": [], **{str(size): [] for size in sizes}}
        trainer.train_step(1)  # warm-up of both sides
        trainer.validate()
        for round_index in range(args.rounds):  # a training step, then each validation size, in turn
            start = time.perf_counter()
            trainer.train_step(2 + round_index)
            timings["step"].append(time.perf_counter() - start)
            for size in sizes:
                trainer.val_problems = pool[:size]
                start = time.perf_counter()
                trainer.validate()
                timings[str(size)].append(time.perf_counter() - start)
            trainer.val_problems = pool
    step = min_median(timings["step"])
    rows = [Row("eval", f"validation of {size} items", "s", step, min_median(timings[str(size)]),
                note=f"before: a training step, {args.threads} thread(s)") for size in sizes]
    defaults = TrainerConfig()
    total = defaults.total_steps
    for label, size, every in (("old", 256, 25), ("default", defaults.val_size, defaults.val_every)):
        if str(size) in timings:  # evaluation / (training + evaluation) of a total_steps run
            count = dataclasses.replace(defaults, val_every=every).evaluations
            shares = [count * evaluation / (total * training + count * evaluation)
                      for training, evaluation in zip(step, min_median(timings[str(size)]), strict=True)]
            rows.append(Row("eval", f"evaluation share of a {total}-step run, {label} schedule ({size} items every "
                            f"{every} steps)", "", None, (shares[0], shares[1])))
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
