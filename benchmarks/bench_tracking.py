"""Cost of logging one training step, against the budget of 1% of a ~0.25 s step (2.5 ms).

Run: ``python benchmarks/bench_tracking.py [--steps 2000]``. Everything is written to a temp folder (W&B too:
offline, with its folders pointed there). Prints one line per measurement: mean time per call and its share of a
0.25 s step.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

STEP_SECONDS = 0.25
BUDGET_SHARE = 0.01
METRIC_COUNT = 40
HISTOGRAM_BINS = 50


def metrics_for(step: int, rng: np.random.Generator) -> dict[str, float]:
    return {f"group{index // 10}/metric{index}": float(value) for index, value in enumerate(rng.random(METRIC_COUNT))}


def time_per_call(function: Callable[[int], None], calls: int, repeats: int = 3) -> float:
    """Median over ``repeats`` of the mean seconds per call of ``function(step)`` over ``calls`` steps."""
    return statistics.median(means_per_call(function, calls, repeats))


def means_per_call(function: Callable[[int], None], calls: int, repeats: int = 3) -> list[float]:
    """The mean seconds per call of ``function(step)`` over ``calls`` steps, once per repeat."""
    means = []
    for repeat in range(repeats):
        start = time.perf_counter()
        for step in range(repeat * calls, (repeat + 1) * calls):
            function(step)
        means.append((time.perf_counter() - start) / calls)
    return means


def report(label: str, seconds: float) -> None:
    share = seconds / STEP_SECONDS
    verdict = "ok" if share <= BUDGET_SHARE else "OVER BUDGET"
    print(f"{label:<58} {seconds * 1e6:10.1f} us   {share * 100:7.3f}% of a {STEP_SECONDS} s step   {verdict}")


def main(argv: list[str] | None = None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="calls per measurement (default 2000)")
    steps = parser.parse_args(argv).steps

    root = pathlib.Path(tempfile.mkdtemp(prefix="bench_tracking_"))
    for variable in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        os.environ[variable] = str(root / "wandb_home")

    from dataflex_rl.tracking import ConsoleLogger, MultiLogger, RunIdentity, RunStore, WandbLogger

    rng = np.random.default_rng(0)
    payloads = [metrics_for(step, rng) for step in range(64)]
    edges = np.linspace(0.0, 2.0, HISTOGRAM_BINS + 1)
    counts = rng.integers(0, 1000, HISTOGRAM_BINS)
    print(f"{METRIC_COUNT} metric keys per step, {HISTOGRAM_BINS}-bin histograms, {steps} calls per measurement")
    print(f"budget: {BUDGET_SHARE:.0%} of {STEP_SECONDS} s = {STEP_SECONDS * BUDGET_SHARE * 1e3:.1f} ms per step\n")

    # --- run store ---------------------------------------------------------------------------------------------
    store = RunStore(root / "store")
    report(
        "RunStore.log_metrics (one write(2) per line)",
        time_per_call(lambda s: store.log_metrics(s, payloads[s % 64]), steps),
    )

    durable = RunStore(root / "durable")

    def log_and_fsync(step: int) -> None:
        durable.log_metrics(step, payloads[step % 64])
        os.fsync(durable._handles["metrics.jsonl"].fileno())

    report(
        "RunStore.log_metrics + os.fsync (not used; for comparison)", time_per_call(log_and_fsync, max(steps // 10, 20))
    )
    report("RunStore.log_histogram", time_per_call(lambda s: store.log_histogram(s, "h", edges, counts), steps))
    start = time.perf_counter()
    store.close()
    label = f"RunStore.close: compaction of {3 * steps} steps to parquet"
    print(f"{label:<58} {time.perf_counter() - start:10.3f} s (once per run)")

    # --- W&B offline ------------------------------------------------------------------------------------------
    identity = RunIdentity(
        sweep="bench", run="a0.5-s0", backend="local", mechanism="reweight", alpha=0.5, seed=0, config_hash="0" * 12
    )
    config = {"trainer": {"steps": steps}, "dataflex": {"actuator": {"params": {"alpha": 0.5}}}}
    start = time.perf_counter()
    wandb_logger = WandbLogger(identity=identity, run_dir=root / "wandb_run", config=config, mode="offline")
    init_seconds = time.perf_counter() - start
    assert wandb_logger.active, wandb_logger.unavailable_reason
    print(f"{'wandb.init offline (first in process, incl. import wandb)':<58} {init_seconds:10.3f} s (once per run)")
    report(
        "WandbLogger.log_metrics (wandb.log, offline)",
        time_per_call(lambda s: wandb_logger.log_metrics(s, payloads[s % 64]), steps),
    )
    offset = 3 * steps
    report(
        "WandbLogger.log_histogram (wandb.Histogram, offline)",
        time_per_call(lambda s: wandb_logger.log_histogram(offset + s, "h", edges, counts), max(steps // 4, 20)),
    )
    start = time.perf_counter()
    wandb_logger.close()
    print(f"{'wandb finish':<58} {time.perf_counter() - start:10.3f} s (once per run)")

    # --- the whole stack, as build_loggers makes it --------------------------------------------------------------
    start = time.perf_counter()
    full_store = RunStore(root / "full")
    second = WandbLogger(identity=identity, run_dir=full_store.run_dir, config=config, mode="offline")
    print(f"{'wandb.init offline (second in process)':<58} {time.perf_counter() - start:10.3f} s (once per run)")
    loggers = MultiLogger([full_store, second, ConsoleLogger(every=10)], critical=[full_store], hist_every=10)

    def full_step(step: int) -> None:
        loggers.log_metrics(step, payloads[step % 64])
        if loggers.wants_histogram(step):
            loggers.log_histogram(step, "h", edges, counts)

    means = means_per_call(full_step, steps)
    report("MultiLogger step: store + W&B + console, histogram every 10", statistics.median(means))
    loggers.close()
    print(f"\nfiles under {root}")
    from benchmarks.common import Row, min_median

    return [Row("tracking", "log one step: run store + W&B offline + console (main thread)", "ms", None,
                min_median([mean * 1e3 for mean in means]),
                note="W&B's service process is counted in the local step's logging share")]


if __name__ == "__main__":
    main()
