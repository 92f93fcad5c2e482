"""Tracking: the cost of logging one training step (run store, W&B offline, console, as ``build_loggers`` stacks them)
against the budget of 1% of a ~0.25 s step, and what an fsync per metrics line would add. Everything is written to a
temp folder (W&B's folders too)."""

from __future__ import annotations

import itertools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.common import Row, interleaved, min_median, options, printed

STEP_SECONDS, BUDGET_SHARE = 0.25, 0.01
METRIC_COUNT, HISTOGRAM_BINS = 40, 50


def calls_of_each_logger(folder: Path, calls: int) -> tuple[dict[str, tuple[Callable[[int], None], int]], object]:
    """``{side: (one call at a step, calls per round)}`` over one run store, one offline W&B run and the console,
    and the stack of the three."""
    from dataflex_rl.tracking import ConsoleLogger, MultiLogger, RunIdentity, RunStore, WandbLogger

    rng = np.random.default_rng(0)
    payloads = [{f"group{index // 10}/metric{index}": float(value)
                 for index, value in enumerate(rng.random(METRIC_COUNT))} for _ in range(64)]
    edges, counts = np.linspace(0.0, 2.0, HISTOGRAM_BINS + 1), rng.integers(0, 1000, HISTOGRAM_BINS)
    identity = RunIdentity(sweep="bench", run="a0.5-s0", backend="local", mechanism="reweight", alpha=0.5, seed=0,
                           config_hash="0" * 12)
    store = RunStore(folder / "run")
    start = time.perf_counter()
    wandb = WandbLogger(identity=identity, run_dir=store.run_dir, config={"alpha": 0.5})
    print(f"wandb.init offline, incl. import wandb: {time.perf_counter() - start:.2f} s (once per run)")
    assert wandb.active, wandb.unavailable_reason
    loggers = MultiLogger([store, wandb, ConsoleLogger(every=10)], critical=[store], hist_every=10)

    def metrics(logger):
        return lambda step: logger.log_metrics(step, payloads[step % 64])

    def histogram(logger):
        return lambda step: logger.log_histogram(step, "h", edges, counts)

    def fsynced(step: int) -> None:
        metrics(store)(step)
        os.fsync(store._handles["metrics.jsonl"].fileno())

    def stack_step(step: int) -> None:
        metrics(loggers)(step)
        if loggers.wants_histogram(step):
            histogram(loggers)(step)

    return {"RunStore.log_metrics (one write(2) per line)": (metrics(store), calls),
            "RunStore.log_metrics + os.fsync (not used)": (fsynced, max(calls // 10, 10)),
            "RunStore.log_histogram": (histogram(store), calls),
            "WandbLogger.log_metrics (wandb.log, offline)": (metrics(wandb), calls),
            "WandbLogger.log_histogram (wandb.Histogram)": (histogram(wandb), calls),
            "one step: store + W&B + console, histogram every 10": (stack_step, calls)}, loggers


def main(argv: list[str] | None = None) -> list[Row]:
    args = options(__doc__, argv, calls=(500, "calls of each side per round"), rounds=5)
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as folder, mock.patch.dict(os.environ, {
            variable: str(Path(folder) / "wandb_home") for variable in ("WANDB_DIR", "WANDB_CACHE_DIR",
                                                                        "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}):
        sides, loggers = calls_of_each_logger(Path(folder), args.calls)
        steps = itertools.count()  # one step number per call: every logger sees its steps increase
        times = interleaved({name: lambda log=log, count=count: [log(step) for step in itertools.islice(steps, count)]
                             for name, (log, count) in sides.items()}, rounds=args.rounds)
        per_call = {name: min_median(times[name], 1e3 / count) for name, (_, count) in sides.items()}
        for name, (_, median) in per_call.items():
            share = median / 1e3 / STEP_SECONDS
            print(f"{name:<56} {median * 1e3:9.1f} us {share:8.3%} of a {STEP_SECONDS} s step "
                  f"({'ok' if share <= BUDGET_SHARE else 'OVER BUDGET'})")
        start = time.perf_counter()
        loggers.close()
        print(f"close (compaction to parquet, W&B finish): {time.perf_counter() - start:.2f} s (once per run)")
    plain, fsynced, *_, stack = per_call.values()
    return printed([Row("tracking", "metrics.jsonl line: fsync'ed -> as written", "ms", fsynced, plain),
                    Row("tracking", "log one step: run store + W&B offline + console (main thread)", "ms", None,
                        stack, ratio=stack[1] / 1e3 / STEP_SECONDS,
                        note=f"ratio = share of a {STEP_SECONDS} s step (budget {BUDGET_SHARE:.0%}); W&B's service "
                             f"process is counted in the local step's logging share")])


if __name__ == "__main__":
    main()
