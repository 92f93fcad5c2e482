"""verl's CPU mode against the local backend, the same tiny GRPO run launched as a user does: step time, run time
and peak memory (docs/performance.md)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import Row, min_median

STEPS = 4
SHARED = ["trainer.logger=[console]"]


def peak_tree_rss(process: subprocess.Popen, samples: list[int]) -> None:
    """Append the process tree's summed RSS every 0.2 s until the process ends."""
    try:
        root = psutil.Process(process.pid)
        while process.poll() is None:
            total = 0
            for member in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += member.memory_info().rss
            samples.append(total)
            time.sleep(0.2)
    except psutil.Error:
        return


def timed_run(command: list[str], environment: dict[str, str], log: Path) -> tuple[float, float]:
    """``(wall seconds, peak tree RSS in GB)`` of one run; raises when it fails."""
    samples: list[int] = []
    start = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=log.parent)
        watcher = threading.Thread(target=peak_tree_rss, args=(process, samples), daemon=True)
        watcher.start()
        code = process.wait()
        watcher.join()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{command[:3]} exited {code}; see {log}")
    return wall, max(samples, default=0) / 1e9


def step_seconds(run_dir: Path) -> float:
    """Median ``timing_s/step`` over steps 2.. of a run store."""
    from dataflex_rl.keys import TIMING_STEP
    from dataflex_rl.tracking.run_store import read_metrics

    metrics = read_metrics(run_dir)
    return float(metrics.loc[metrics["step"] >= 2, TIMING_STEP].dropna().median())


def verl_side(root: Path, prepared: Path, index: int) -> tuple[float, float, float]:
    from dataflex_rl.verl.command import build_verl_command, experiment_environment

    run_dir = root / f"verl-{index}"
    run_dir.mkdir()
    command = build_verl_command("verl_cpu_tiny", ["dataflex.actuator.params.alpha=0.5"], [
        f"prepared={prepared}", f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false",
        "trainer.test_freq=-1", f"+dataflex_run.dir={run_dir}", f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *SHARED])
    environment = {**os.environ, **experiment_environment("verl_cpu_tiny")}
    wall, memory = timed_run(command, environment, run_dir / "run.log")
    return step_seconds(run_dir), wall, memory


def local_side(root: Path, prepare_overrides: list[str], index: int) -> tuple[float, float, float]:
    run_dir = root / f"local-{index}"
    command = [sys.executable, "-m", "dataflex_rl.local.train", f"run_dir={run_dir}", *prepare_overrides,
               f"trainer.total_steps={STEPS}", "trainer.prompts_per_step=16", "trainer.rollouts_per_prompt=8",
               "trainer.lr=1e-4", "trainer.val_every=0", "trainer.val_size=64", "trainer.save_every=0",
               "logger.wandb.mode=disabled", "dataflex.actuator.params.alpha=0.5", "threads=1"]
    (root / "logs").mkdir(exist_ok=True)
    wall, memory = timed_run(command, {**os.environ}, root / "logs" / f"local-{index}.log")
    return step_seconds(run_dir), wall, memory


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args(argv)
    from dataflex_rl.verl.command import load_experiment
    from dataflex_rl.verl.cpu.prepare import prepare

    prepare_overrides = [str(item) for item in load_experiment("verl_cpu_tiny").prepare.overrides]
    with tempfile.TemporaryDirectory(prefix="bench-verl-cpu-") as folder:
        root = Path(folder)
        prepared = prepare(root / "prepared", prepare_overrides, train_size=4096, test_size=64)
        sides = {"local": lambda index: local_side(root, prepare_overrides, index),
                 "verl": lambda index: verl_side(root, prepared, index)}
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
        for name, side in sides.items():  # warm-up: page cache, the SFT cache, Ray's first start
            side(-1)
        for index in range(options.rounds):
            for name in (list(sides) if index % 2 == 0 else list(sides)[::-1]):
                results[name].append(sides[name](index))
    rows = []
    for position, (measure, unit) in enumerate((("step time (16x8, steps 2..)", "s"), ("run time (4 steps)", "s"),
                                                ("peak memory, process tree", "GB"))):
        local = min_median([result[position] for result in results["local"]])
        verl = min_median([result[position] for result in results["verl"]])
        rows.append(Row("verl_cpu", f"{measure}: local -> verl CPU mode", unit, local, verl))
        print(f"{measure}: local {local[0]:.2f}/{local[1]:.2f} {unit}, verl CPU mode {verl[0]:.2f}/{verl[1]:.2f} "
              f"{unit} (min/median of {options.rounds})", flush=True)
    return rows


if __name__ == "__main__":
    main()
