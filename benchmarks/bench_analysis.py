"""Analysis: load and aggregate 200 runs x 2000 steps x 20 metrics from parquet run stores, against a
straightforward pandas loader and the 2 s target (what it holds fixed: ``docs/performance.md``)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import aggregate, load
from benchmarks.common import Row, interleaved, min_median, options, printed
from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, config_hash

TARGET_SECONDS = 2.0
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def write_fixture(sweep_dir: Path, n_runs: int, n_steps: int, n_metrics: int) -> None:
    """A sweep folder of ``n_runs`` completed runs written through the run store's own writer."""
    rng = np.random.default_rng(0)
    names = [keys.VAL_ACCURACY, *(f"bench/metric_{index:02d}" for index in range(n_metrics - 1))]
    for index in range(n_runs):
        alpha, seed, run = ALPHAS[index % len(ALPHAS)], index // len(ALPHAS), f"run-{index:04d}"
        values = np.cumsum(rng.normal(0.001 * (1 + alpha), 0.01, size=(n_steps, n_metrics)), axis=0)
        config = {"seed": seed, "dataflex": {"actuator": {"params": {"alpha": alpha}}}}
        store = RunStore(sweep_dir / run)
        store.write_config(config)
        store.write_meta(RunIdentity(sweep=sweep_dir.name, run=run, backend="local", mechanism="reweight",
                                     alpha=alpha, seed=seed, config_hash=config_hash(config)))
        for step in range(n_steps):
            store.log_metrics(step, dict(zip(names, values[step].tolist(), strict=True)))
        store.close()


def straightforward_load(sweep_dir: Path) -> pd.DataFrame:
    """The loader one writes first: per run read the wide parquet, melt to long, add identity, concat."""
    frames = []
    for run_dir in load.find_run_dirs(sweep_dir):
        meta = pd.read_json(run_dir / "meta.json", typ="series")
        long = pd.read_parquet(run_dir / "metrics.parquet").melt(id_vars="step", var_name="metric",
                                                                  value_name="value").dropna(subset=["value"])
        for column in ("sweep", "run", "backend", "mechanism", "alpha", "seed"):
            long[column] = meta[column]
        frames.append(long)
    return pd.concat(frames, ignore_index=True)


def load_and_aggregate(sweep_dir: Path) -> pd.DataFrame:
    """Summaries of every metric, per-alpha statistics and paired deltas against alpha = 0."""
    summaries = aggregate.run_summaries(load.load_sweep(sweep_dir, histograms=False).metrics)
    statistics = aggregate.aggregate_runs(summaries, n_bootstrap=1000, random_state=0)
    deltas = aggregate.paired_differences(summaries, n_bootstrap=1000, random_state=0)
    return statistics.merge(deltas, on=["alpha", "metric"], how="left", suffixes=("", "_delta"))


def main(argv: list[str] | None = None) -> list[Row]:
    args = options(__doc__, argv, runs=200, steps=2000, metrics=20, rounds=3)
    shape = f"{args.runs} runs x {args.steps} steps x {args.metrics} metrics"
    with tempfile.TemporaryDirectory() as temporary:
        sweep_dir, start = Path(temporary) / "bench-sweep", time.perf_counter()
        write_fixture(sweep_dir, args.runs, args.steps, args.metrics)
        print(f"fixture: {shape} written in {time.perf_counter() - start:.1f} s (not timed)")
        sides = {"straightforward": lambda: straightforward_load(sweep_dir),
                 "load_sweep": lambda: load.load_sweep(sweep_dir, histograms=False),
                 "load + aggregate": lambda: load_and_aggregate(sweep_dir)}
        last: dict[str, object] = {}  # each side's last result, checked below
        times = interleaved({name: lambda name=name: last.__setitem__(name, sides[name]()) for name in sides},
                            rounds=args.rounds)
    rows = args.runs * args.steps * args.metrics
    assert len(last["load_sweep"].metrics) == rows == len(last["straightforward"]), rows
    assert len(last["load + aggregate"]) == len(ALPHAS[: args.runs]) * args.metrics
    total = min_median(times["load + aggregate"])
    return printed([Row("analysis", f"load: straightforward pandas -> load_sweep ({shape})", "s",
                        min_median(times["straightforward"]), min_median(times["load_sweep"])),
                    Row("analysis", "load + aggregate (bootstrap CIs, paired deltas)", "s", None, total,
                        ratio=total[1] / TARGET_SECONDS, note=f"ratio = median / the {TARGET_SECONDS:.0f} s target "
                        f"({'meets' if total[1] <= TARGET_SECONDS else 'misses'} it)")])


if __name__ == "__main__":
    main()
