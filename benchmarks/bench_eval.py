"""Evaluation cost: what a validation of ``val_size`` items costs against a run's training steps.

Holds fixed: the default experiment (tiny model, arithmetic, SFT warm start, 32 prompts x 8 rollouts), one thread
per process as a sweep runs it (``--threads``). Changes one thing: the number of greedy validation items. Both sides
are warmed up and measured in interleaved rounds (training step, then each validation size), min and median printed.
A run's evaluation cost is ``n_evaluations x validate_s``; its training cost ``total_steps x step_s``; the share
printed is ``evaluation / (training + evaluation)`` for the old (256 items every 25 steps) and new
(``conf/trainer/grpo.yaml``) schedules.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _trainer(threads: int, val_size: int, run_dir: Path):
    from hydra import compose, initialize_config_dir

    from dataflex_rl import build_mechanism
    from dataflex_rl.local.config import parse_train_config
    from dataflex_rl.local.sft import warm_start
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tasks import build_task
    from dataflex_rl.tracking.base import MultiLogger
    from dataflex_rl.train import CONF_DIR
    from omegaconf import OmegaConf

    overrides = [f"run_dir={run_dir}", f"threads={threads}", f"trainer.val_size={val_size}",
                 f"task.test_size={max(val_size, 256)}", "logger.wandb.mode=disabled"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    config = parse_train_config(resolved)
    torch.set_num_threads(threads)
    task = build_task(config.task.name, config.task.params)
    model, tokenizer, _ = warm_start(config.model, config.task, config.sft, task)
    return GRPOTrainer(config, task, model, tokenizer, build_mechanism(config.dataflex), MultiLogger([]),
                       run_dir / "checkpoints")


def _schedule_evaluations(total_steps: int, val_every: int) -> int:
    """Evaluations in a run: step 0, every ``val_every`` steps, and the last step."""
    steps = {0, total_steps}
    if val_every > 0:
        steps.update(range(val_every, total_steps + 1, val_every))
    return len(steps)


def main(argv=None) -> dict[str, float]:
    from hydra import compose, initialize_config_dir

    from dataflex_rl.train import CONF_DIR

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="256,1024,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        defaults = compose(config_name="train").trainer
    with tempfile.TemporaryDirectory() as directory:
        trainer = _trainer(args.threads, max(sizes), Path(directory) / "run")
        pool = trainer.val_problems
        timings: dict[str, list[float]] = {"step": [], **{str(s): [] for s in sizes}}
        trainer.train_step(1)  # warm-up of both sides
        trainer.validate()
        for round_index in range(args.rounds):
            start = time.perf_counter()
            trainer.train_step(2 + round_index)
            timings["step"].append(time.perf_counter() - start)
            for size in sizes:
                trainer.val_problems = pool[:size]
                start = time.perf_counter()
                trainer.validate()
                timings[str(size)].append(time.perf_counter() - start)
            trainer.val_problems = pool
    step_s = statistics.median(timings["step"])
    print(f"training step (32 prompts x 8 rollouts, {args.threads} thread(s)): min {min(timings['step']):.3f} s, "
          f"median {step_s:.3f} s")
    result = {"step_s": step_s}
    for size in sizes:
        result[f"validate_{size}_s"] = statistics.median(timings[str(size)])
        print(f"validation of {size:5d} items: min {min(timings[str(size)]):.3f} s, "
              f"median {result[f'validate_{size}_s']:.3f} s")
    total = int(defaults.total_steps)
    for label, size, every in (("old (256 items every 25 steps)", 256, 25),
                               (f"default ({defaults.val_size} items every {defaults.val_every} steps)",
                                int(defaults.val_size), int(defaults.val_every))):
        per_eval = result.get(f"validate_{size}_s")
        if per_eval is None:
            continue
        evaluation = _schedule_evaluations(total, every) * per_eval
        share = evaluation / (total * step_s + evaluation)
        result[f"share_{size}_{every}"] = share
        print(f"{label}: {evaluation:.1f} s of evaluation in a {total}-step run, {share:.1%} of its wall time")
    return result


if __name__ == "__main__":
    main()
