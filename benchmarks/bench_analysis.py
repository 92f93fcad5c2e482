"""Analysis: load and aggregate 200 runs x 2000 steps x 20 metrics from parquet run stores, against a
straightforward pandas loader and the 2 s target (what it holds fixed: ``docs/performance.md``)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import aggregate, load
from benchmarks.common import Row, format_table, interleaved, min_median
from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, config_hash

TARGET_SECONDS = 2.0
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def write_fixture(root: Path, n_runs: int, n_steps: int, n_metrics: int, random_state: int = 0) -> Path:
    """A sweep folder of ``n_runs`` completed runs written through the run store's own writer."""
    rng = np.random.default_rng(random_state)
    sweep_dir = root / "bench-sweep"
    names = [keys.VAL_ACCURACY, *(f"bench/metric_{index:02d}" for index in range(n_metrics - 1))]
    for index in range(n_runs):
        alpha, seed, run = ALPHAS[index % len(ALPHAS)], index // len(ALPHAS), f"run-{index:04d}"
        values = np.cumsum(rng.normal(0.001 * (1 + alpha), 0.01, size=(n_steps, n_metrics)), axis=0)
        config = {"seed": seed, "dataflex": {"actuator": {"params": {"alpha": alpha}}}}
        store = RunStore(sweep_dir / run)
        store.write_config(config)
        store.write_meta(RunIdentity(sweep="bench-sweep", run=run, backend="local", mechanism="reweight",
                                     alpha=alpha, seed=seed, config_hash=config_hash(config)))
        for step in range(n_steps):
            store.log_metrics(step, dict(zip(names, values[step].tolist(), strict=True)))
        store.close()
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


def aggregate_everything(data) -> pd.DataFrame:
    """Summaries of every metric, per-alpha statistics and paired deltas against alpha = 0."""
    summaries = aggregate.run_summaries(data.metrics)
    statistics = aggregate.aggregate_runs(summaries, n_bootstrap=1000, random_state=0)
    deltas = aggregate.paired_differences(summaries, n_bootstrap=1000, random_state=0)
    return statistics.merge(deltas, on=["alpha", "metric"], how="left", suffixes=("", "_delta"))


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as temporary:
        start = time.perf_counter()
        sweep_dir = write_fixture(Path(temporary), arguments.runs, arguments.steps, arguments.metrics)
        print(f"fixture: {arguments.runs} runs x {arguments.steps} steps x {arguments.metrics} metrics "
              f"written in {time.perf_counter() - start:.1f} s (not timed)")
        times = interleaved({
            "straightforward": lambda: results.__setitem__("naive", straightforward_load(sweep_dir)),
            "load_sweep": lambda: results.__setitem__("data", load.load_sweep(sweep_dir, histograms=False)),
            "load + aggregate": lambda: results.__setitem__(
                "aggregate", aggregate_everything(load.load_sweep(sweep_dir, histograms=False)))},
            rounds=arguments.rounds)
    rows = arguments.runs * arguments.steps * arguments.metrics
    assert len(results["data"].metrics) == rows == len(results["naive"]), rows
    assert len(results["aggregate"]) == len(ALPHAS[: arguments.runs]) * arguments.metrics
    total = min_median(times["load + aggregate"])
    shape = f"{arguments.runs} runs x {arguments.steps} steps x {arguments.metrics} metrics"
    verdict = "meets" if total[1] <= TARGET_SECONDS else "misses"
    table = [Row("analysis", f"load: straightforward pandas -> load_sweep ({shape})", "s",
                 min_median(times["straightforward"]), min_median(times["load_sweep"])),
             Row("analysis", "load + aggregate (bootstrap CIs, paired deltas)", "s", None, total,
                 ratio=total[1] / TARGET_SECONDS,
                 note=f"ratio = median / the {TARGET_SECONDS:.0f} s target ({verdict} it)")]
    print(format_table(table))
    return table


if __name__ == "__main__":
    main()
