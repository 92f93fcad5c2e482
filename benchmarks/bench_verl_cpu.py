"""verl's CPU mode against the local backend, the same tiny GRPO run launched as a user does: step time, run time
and peak memory (what it holds fixed: docs/performance.md)."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.common import Row, interleaved, min_median, options, printed

STEPS = 4
MEASURES = (("step time (16x8, steps 2..)", "s"), (f"run time ({STEPS} steps)", "s"),
            ("peak memory, process tree", "GB"))


def timed_run(command: list[str], environment: dict[str, str], log: Path, run_dir: Path) -> tuple[float, ...]:
    """``(median timing_s/step of steps 2.., wall seconds, peak RSS of the process tree in GB)`` of one run, the RSS
    summed every 0.2 s (shared pages once per process: an upper bound); raises when the run fails."""
    from dataflex_rl.keys import TIMING_STEP
    from dataflex_rl.tracking.run_store import read_metrics

    peak = [0]

    def watch(process: subprocess.Popen) -> None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(process.pid)
            while process.poll() is None:
                total = 0
                for member in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += member.memory_info().rss
                peak[0] = max(peak[0], total)
                time.sleep(0.2)

    start = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=log.parent)
        watcher = threading.Thread(target=watch, args=(process,), daemon=True)
        watcher.start()
        code = process.wait()
        watcher.join()
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{command[:3]} exited {code}; see {log}")
    metrics = read_metrics(run_dir)
    return float(metrics.loc[metrics["step"] >= 2, TIMING_STEP].dropna().median()), wall, peak[0] / 1e9


def main(argv: list[str] | None = None) -> list[Row]:
    rounds = options(__doc__, argv, rounds=2).rounds
    from dataflex_rl.verl.command import build_verl_command, experiment_environment, load_experiment
    from dataflex_rl.verl.cpu.prepare import prepare

    prepare_overrides = [str(item) for item in load_experiment("verl_cpu_tiny").prepare.overrides]
    with tempfile.TemporaryDirectory(prefix="bench-verl-cpu-") as folder:
        root, runs = Path(folder), itertools.count()
        prepared = prepare(root / "prepared", prepare_overrides, train_size=4096, test_size=64)

        def local() -> tuple[float, ...]:
            run_dir = root / f"local-{next(runs)}"
            command = [sys.executable, "-m", "dataflex_rl.local.train", f"run_dir={run_dir}", *prepare_overrides,
                       f"trainer.total_steps={STEPS}", "trainer.prompts_per_step=16", "trainer.rollouts_per_prompt=8",
                       "trainer.lr=1e-4", "trainer.val_every=0", "trainer.val_size=64", "trainer.save_every=0",
                       "logger.wandb.mode=disabled", "dataflex.actuator.params.alpha=0.5", "threads=1"]
            return timed_run(command, {**os.environ}, root / f"{run_dir.name}.log", run_dir)

        def verl() -> tuple[float, ...]:
            run_dir = root / f"verl-{next(runs)}"
            run_dir.mkdir()
            command = build_verl_command("verl_cpu_tiny", ["dataflex.actuator.params.alpha=0.5"], [
                f"prepared={prepared}", f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false",
                "trainer.test_freq=-1", f"+dataflex_run.dir={run_dir}", f"trainer.default_local_dir={run_dir / 'ckpt'}",
                "trainer.logger=[console]"])
            environment = {**os.environ, **experiment_environment("verl_cpu_tiny")}
            return timed_run(command, environment, run_dir / "run.log", run_dir)

        # warm-up: page cache, the SFT cache, Ray's first start
        results = interleaved({"local": local, "verl": verl}, rounds=rounds, timed=False)
    rows = []
    for position, (measure, unit) in enumerate(MEASURES):
        sides = {name: min_median([result[position] for result in results[name]]) for name in results}
        rows.append(Row("verl_cpu", f"{measure}: local -> verl CPU mode", unit, sides["local"], sides["verl"]))
    return printed(rows)


if __name__ == "__main__":
    main()
