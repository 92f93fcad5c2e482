"""Benchmark: load and aggregate 200 runs x 2000 steps x 20 metrics from parquet run stores.

    python benchmarks/bench_analysis.py [--runs 200] [--steps 2000] [--metrics 20] [--repeats 3]

Writes the fixture sweep into a temporary folder first (not timed), then times, best of ``--repeats``:

- ``load``: :func:`analysis.load.load_sweep` (run table + long table of ``runs x steps x metrics`` rows);
- ``aggregate``: per-run summaries of every metric, per-alpha statistics with bootstrap CIs and paired deltas;
- a straightforward pandas loader (``read_parquet`` + ``melt`` + ``concat`` per run) beside the project's loader.

Prints each time, the speed-up over the straightforward loader and the total against the 2 s target as a ratio
(``<= 1.00`` meets it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import aggregate, load
from analysis.testing import write_fake_run

TARGET_SECONDS = 2.0
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def write_fixture(root: Path, n_runs: int, n_steps: int, n_metrics: int, random_state: int = 0) -> Path:
    """A sweep folder of ``n_runs`` completed runs (alphas cycle over ``ALPHAS``), each ``(n_steps, n_metrics)``."""
    rng = np.random.default_rng(random_state)
    sweep_dir = root / "bench-sweep"
    names = ["val/accuracy", *(f"bench/metric_{index:02d}" for index in range(n_metrics - 1))]
    for index in range(n_runs):
        alpha = ALPHAS[index % len(ALPHAS)]
        seed = index // len(ALPHAS)
        values = np.cumsum(rng.normal(0.001 * (1 + alpha), 0.01, size=(n_steps, n_metrics)), axis=0)
        write_fake_run(sweep_dir / f"run-{index:04d}", sweep="bench-sweep", run=f"run-{index:04d}", alpha=alpha,
                       seed=seed, metrics={name: values[:, column] for column, name in enumerate(names)})
    return sweep_dir


def straightforward_load(sweep_dir: Path) -> pd.DataFrame:
    """The loader one writes first: per run read the wide parquet, melt to long, add identity, concat."""
    frames = []
    for run_dir in load.find_run_dirs(sweep_dir):
        meta = pd.read_json(run_dir / "meta.json", typ="series")
        wide = pd.read_parquet(run_dir / "metrics.parquet")
        long = wide.melt(id_vars="step", var_name="metric", value_name="value").dropna(subset=["value"])
        for column in ("sweep", "run", "backend", "mechanism", "alpha", "seed"):
            long[column] = meta[column]
        frames.append(long)
    return pd.concat(frames, ignore_index=True)


def aggregate_everything(data: load.SweepData) -> pd.DataFrame:
    """Summaries of every metric, per-alpha statistics and paired deltas against alpha = 0."""
    summaries = aggregate.run_summaries(data.metrics)
    statistics = aggregate.aggregate_runs(summaries, n_bootstrap=1000, random_state=0)
    deltas = aggregate.paired_differences(summaries, n_bootstrap=1000, random_state=0)
    return statistics.merge(deltas, on=["alpha", "metric"], how="left", suffixes=("", "_delta"))


def best_time(function: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Smallest wall time of ``repeats`` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark and return the measured seconds (``load``, ``aggregate``, ``straightforward_load``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        start = time.perf_counter()
        sweep_dir = write_fixture(Path(temporary), arguments.runs, arguments.steps, arguments.metrics)
        print(f"fixture: {arguments.runs} runs x {arguments.steps} steps x {arguments.metrics} metrics "
              f"written in {time.perf_counter() - start:.1f} s (not timed)")
        load_time, data = best_time(lambda: load.load_sweep(sweep_dir, histograms=False), arguments.repeats)
        aggregate_time, result = best_time(lambda: aggregate_everything(data), arguments.repeats)
        naive_time, naive = best_time(lambda: straightforward_load(sweep_dir), 1)
    rows = arguments.runs * arguments.steps * arguments.metrics
    assert len(data.metrics) == rows == len(naive), (len(data.metrics), rows, len(naive))
    assert len(result) == len(ALPHAS[: arguments.runs]) * arguments.metrics
    total = load_time + aggregate_time
    print(f"long table: {len(data.metrics):,} rows, {data.metrics.memory_usage(deep=False).sum() / 2**20:.0f} MiB")
    print(f"load_sweep:            {load_time:6.3f} s")
    print(f"straightforward load:  {naive_time:6.3f} s  (load_sweep is {naive_time / load_time:.1f}x faster)")
    print(f"aggregate:             {aggregate_time:6.3f} s")
    print(f"load + aggregate:      {total:6.3f} s  target {TARGET_SECONDS:.1f} s  ratio {total / TARGET_SECONDS:.2f} "
          f"({'meets' if total <= TARGET_SECONDS else 'misses'} the target)")
    return {"load": load_time, "aggregate": aggregate_time, "straightforward_load": naive_time}


if __name__ == "__main__":
    main()
