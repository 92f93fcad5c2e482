"""Tracking: the cost of logging one training step (run store, W&B offline, console) against the budget of 1% of a
~0.25 s step. Everything is written to a temp folder (W&B's folders too)."""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from benchmarks.common import Row, min_median

STEP_SECONDS = 0.25
BUDGET_SHARE = 0.01
METRIC_COUNT = 40
HISTOGRAM_BINS = 50


def report(label: str, function: Callable[[int], None], calls: int, repeats: int = 3) -> list[float]:
    """Print the median mean time per call of ``function(step)`` and its share of a step; the means per repeat."""
    means = []
    for repeat in range(repeats):
        start = time.perf_counter()
        for step in range(repeat * calls, (repeat + 1) * calls):
            function(step)
        means.append((time.perf_counter() - start) / calls)
    seconds = statistics.median(means)
    share = seconds / STEP_SECONDS
    verdict = "ok" if share <= BUDGET_SHARE else "OVER BUDGET"
    print(f"{label:<58} {seconds * 1e6:10.1f} us   {share * 100:7.3f}% of a {STEP_SECONDS} s step   {verdict}")
    return means


def once(label: str, function: Callable[[], object]) -> object:
    start = time.perf_counter()
    result = function()
    print(f"{label:<58} {time.perf_counter() - start:10.3f} s (once per run)")
    return result


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000, help="calls per measurement (default 2000)")
    steps = parser.parse_args(argv).steps
    root = pathlib.Path(tempfile.mkdtemp(prefix="bench_tracking_"))
    for variable in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        os.environ[variable] = str(root / "wandb_home")

    from dataflex_rl.tracking import ConsoleLogger, MultiLogger, RunIdentity, RunStore, WandbLogger

    rng = np.random.default_rng(0)
    payloads = [{f"group{index // 10}/metric{index}": float(value)
                 for index, value in enumerate(rng.random(METRIC_COUNT))} for _ in range(64)]
    edges = np.linspace(0.0, 2.0, HISTOGRAM_BINS + 1)
    counts = rng.integers(0, 1000, HISTOGRAM_BINS)
    print(f"{METRIC_COUNT} metric keys per step, {HISTOGRAM_BINS}-bin histograms, {steps} calls per measurement")
    print(f"budget: {BUDGET_SHARE:.0%} of {STEP_SECONDS} s = {STEP_SECONDS * BUDGET_SHARE * 1e3:.1f} ms per step\n")

    store, durable = RunStore(root / "store"), RunStore(root / "durable")
    report("RunStore.log_metrics (one write(2) per line)", lambda s: store.log_metrics(s, payloads[s % 64]), steps)

    def log_and_fsync(step: int) -> None:
        durable.log_metrics(step, payloads[step % 64])
        os.fsync(durable._handles["metrics.jsonl"].fileno())

    report("RunStore.log_metrics + os.fsync (not used; for comparison)", log_and_fsync, max(steps // 10, 20))
    report("RunStore.log_histogram", lambda s: store.log_histogram(s, "h", edges, counts), steps)
    once(f"RunStore.close: compaction of {3 * steps} steps to parquet", store.close)

    identity = RunIdentity(sweep="bench", run="a0.5-s0", backend="local", mechanism="reweight", alpha=0.5, seed=0,
                           config_hash="0" * 12)
    config = {"trainer": {"steps": steps}, "dataflex": {"actuator": {"params": {"alpha": 0.5}}}}
    wandb_logger = once("wandb.init offline (first in process, incl. import wandb)",
                        lambda: WandbLogger(identity=identity, run_dir=root / "wandb_run", config=config))
    assert wandb_logger.active, wandb_logger.unavailable_reason
    report("WandbLogger.log_metrics (wandb.log, offline)", lambda s: wandb_logger.log_metrics(s, payloads[s % 64]),
           steps)
    report("WandbLogger.log_histogram (wandb.Histogram, offline)",
           lambda s: wandb_logger.log_histogram(3 * steps + s, "h", edges, counts), max(steps // 4, 20))
    once("wandb finish", wandb_logger.close)

    # The whole stack, as build_loggers makes it.
    full_store = RunStore(root / "full")
    second = once("wandb.init offline (second in process)",
                  lambda: WandbLogger(identity=identity, run_dir=full_store.run_dir, config=config))
    loggers = MultiLogger([full_store, second, ConsoleLogger(every=10)], critical=[full_store], hist_every=10)

    def full_step(step: int) -> None:
        loggers.log_metrics(step, payloads[step % 64])
        if loggers.wants_histogram(step):
            loggers.log_histogram(step, "h", edges, counts)

    means = report("MultiLogger step: store + W&B + console, histogram every 10", full_step, steps)
    loggers.close()
    print(f"\nfiles under {root}")
    return [Row("tracking", "log one step: run store + W&B offline + console (main thread)", "ms", None,
                min_median([mean * 1e3 for mean in means]),
                note="W&B's service process is counted in the local step's logging share")]


if __name__ == "__main__":
    main()
