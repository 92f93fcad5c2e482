"""The SFT recipe search behind the default warm start: ``python -m sweeps.sft_search``.

Each point (the model's num_layers x lr x batch_size x warmup_steps x target_accuracy x check_every, the other
settings at their defaults) trains one warm start per seed of the default experiment's model and task, one thread
each, and measures its stop step, its CPU seconds (training and the stopping rule's checks: one core's time,
whatever else the machine runs) and its greedy accuracy on the RL validation problems (the runs' step-0
``val/accuracy``). Written as ``docs/results/<name>.md``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence

from dataflex_rl.validation import ConfigError

MODEL_KEYS = ("num_layers",)  # a point's keys of the model block; the others are the sft block's
POINT_KEYS = (*MODEL_KEYS, "lr", "batch_size", "warmup_steps", "target_accuracy", "check_every")


@dataclasses.dataclass(frozen=True)
class Measured:
    steps: int
    cpu_seconds: float
    val_accuracy: float
    reached: bool | None


def measure(point: dict, seed: int, cap: int) -> Measured:
    """One warm start of ``point`` for ``seed`` from the default experiment, in this (one-thread) process."""
    import torch

    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.local.trainer import val_problems
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tasks import build_task
    from dataflex_rl.tinylm.model import build_model
    from dataflex_rl.tinylm.sft import greedy_accuracy, run_sft

    torch.set_num_threads(1)
    overrides = [f"sft.steps={cap}", f"sft.seed={seed}",
                 *(f"{'model' if key in MODEL_KEYS else 'sft'}.{key}={'null' if value is None else value}"
                   for key, value in point.items())]
    config = parse_train_config(compose_train_config(overrides))
    task = build_task(config.task.name, config.task.params)
    model, tokenizer = build_model(config.model, task.alphabet, seed=seed)
    start = time.process_time()
    outcome = run_sft(model, tokenizer, task, config.sft)
    seconds = time.process_time() - start
    val = val_problems(task, config.trainer)
    return Measured(outcome.steps, seconds, greedy_accuracy(model, tokenizer, task, val), outcome.reached)


def search(points: list[dict], seeds: Sequence[int], cap: int, jobs: int) -> list[tuple[dict, list[Measured]]]:
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        futures = {(index, seed): pool.submit(measure, point, seed, cap)
                   for index, point in enumerate(points) for seed in seeds}
        return [(point, [futures[index, seed].result() for seed in seeds]) for index, point in enumerate(points)]


def _cell(point: dict, key: str) -> str:
    value = point.get(key)
    return "none (all steps)" if value is None else f"{value:g}"


def results_text(name: str, rows: list[tuple[dict, list[Measured]]], seeds: Sequence[int], cap: int,
                 argv: Sequence[str], wall_seconds: float) -> str:
    lines = [f"<!-- {name}: written by `python -m sweeps.sft_search {' '.join(argv)}`; do not edit by hand -->", "",
             f"SFT recipe search, seeds {', '.join(map(str, seeds))}, cap {cap} steps, the default model at each "
             f"row's depth and the arithmetic task; each warm start one thread, its CPU seconds (one core's time) "
             f"measured by the process. val/accuracy: greedy, on the RL validation problems (the runs' step 0). RL "
             f"gain is not measured here: the chosen point's is the default sweep's.", "",
             "| num_layers | lr | batch_size | warmup_steps | target_accuracy | check_every | steps (per seed) "
             "| CPU s mean (max) | val/accuracy per seed | mean | SD | reached |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for point, measured in rows:
        accuracies = [m.val_accuracy for m in measured]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else float("nan")
        reached = sum(m.reached is True for m in measured)
        lines.append(
            f"| {_cell(point, 'num_layers')} | {_cell(point, 'lr')} | {_cell(point, 'batch_size')} "
            f"| {_cell(point, 'warmup_steps')} | {_cell(point, 'target_accuracy')} | {_cell(point, 'check_every')} "
            f"| {', '.join(str(m.steps) for m in measured)} "
            f"| {statistics.mean(m.cpu_seconds for m in measured):.1f} ({max(m.cpu_seconds for m in measured):.1f}) "
            f"| {', '.join(f'{a:.3f}' for a in accuracies)} | {statistics.mean(accuracies):.3f} | {spread:.3f} "
            f"| {'-' if point.get('target_accuracy') is None else f'{reached}/{len(measured)}'} |")
    lines += ["", f"- machine: {platform.machine()}, {os.cpu_count()} cores; the search's wall time "
              f"{wall_seconds / 60:.1f} min", ""]
    return "\n".join(lines)


def _values(flag: str, text: str, convert) -> list:
    """``a,b,c`` as values of ``convert`` (``none``: None); ValueError naming the flag and the value."""
    try:
        return [None if item.strip().lower() == "none" else convert(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} = {text!r} is not allowed: it must be comma-separated "
                         f"{convert.__name__} values") from None


def main(argv: Sequence[str] | None = None) -> int:
    from dataflex_rl.run_config import ModelConfig, SFTConfig

    parser = argparse.ArgumentParser(prog="python -m sweeps.sft_search", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default=str(ModelConfig.num_layers), help="comma-separated model depths")
    parser.add_argument("--lr", default=f"{SFTConfig.lr:g}", help="comma-separated SFT learning rates")
    parser.add_argument("--batch-size", default=str(SFTConfig.batch_size), help="comma-separated SFT batch sizes")
    parser.add_argument("--warmup", default=str(SFTConfig.warmup_steps), help="comma-separated warm-up lengths (steps)")
    parser.add_argument("--target", default="none", help="comma-separated target accuracies; none: all steps")
    parser.add_argument("--check-every", default="25", help="comma-separated check intervals (steps)")
    parser.add_argument("--seeds", default="1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--cap", type=int, default=500, help="SFT steps, the cap under a target")
    parser.add_argument("--jobs", type=int, default=2, help="warm starts at once, one thread each")
    parser.add_argument("--name", default="sft_search", help="the results file: docs/results/<name>.md")
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parser.parse_args(argv)
    try:
        axes = {"num_layers": _values("--layers", options.layers, int),
                "lr": _values("--lr", options.lr, float),
                "batch_size": _values("--batch-size", options.batch_size, int),
                "warmup_steps": _values("--warmup", options.warmup, int),
                "target_accuracy": _values("--target", options.target, float),
                "check_every": _values("--check-every", options.check_every, int)}
        seeds = _values("--seeds", options.seeds, int)
        points = [dict(zip(POINT_KEYS, values)) for values in itertools.product(*axes.values())]
        for point in points:  # each point checked before any training
            ModelConfig(**{key: point[key] for key in MODEL_KEYS})
            SFTConfig(steps=options.cap, **{key: value for key, value in point.items() if key not in MODEL_KEYS})
    except (ConfigError, ValueError) as error:
        parser.error(str(error))
    from analysis.results import check_results_name, publish
    check_results_name(options.name, "--name")
    start = time.perf_counter()
    rows = search(points, seeds, options.cap, options.jobs)
    path, changed = publish(options.name, lambda: results_text(options.name, rows, seeds, options.cap,
                                                                list(argv),
                                                                time.perf_counter() - start))
    print(path.read_text())
    print(f"results: {path}" + (f"; docs updated: {', '.join(map(str, changed))}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
