"""Running verl's real trainer in its CPU mode from the tests: a prepared model folder and one verl run.

A run is ``python -m verl.trainer.main_ppo`` as the command builder writes it for ``verl_cpu_tiny``, in a fresh
process with the CPU mode's environment (real Ray, TransferQueue, the FSDP2 engine on gloo, the reward manager, the
checkpoint engine and the project's rollout server), writing the project's run store. Its console goes to
``verl.log`` beside the run store; a failed assertion shows the log's tail.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dataflex_rl.verl.command import EXPERIMENT_DIR, build_verl_command, experiment_environment, load_experiment
from dataflex_rl.verl.cpu.prepare import prepare

EXPERIMENT = "verl_cpu_tiny"
# A short SFT on 1-2 digit sums: about 0.23 greedy accuracy after 250 steps (measured), enough correct samples in
# a step's groups for non-zero advantages, in about 40 s on one thread (a 60-step SFT scored 0: every advantage 0).
# Fixed-length (no stopping rule), as docs/verl.md's figures were measured.
TEST_PREPARE_OVERRIDES = ("task.max_digits=2", "sft.steps=250", "sft.target_accuracy=null")
RUN_TIMEOUT_S = 1200  # a wait, not a timing assertion: a 2-step run takes about a minute on an idle 2-core machine


def prepare_folder(root: Path, overrides: Sequence[str] = TEST_PREPARE_OVERRIDES) -> Path:
    """The experiment's prepare step with ``overrides`` into ``root/prepared`` (SFT cached under ``root/sft-cache``)."""
    overrides = [*(str(item) for item in load_experiment(EXPERIMENT).prepare.overrides), *overrides,
                 f"sft.cache_dir={root / 'sft-cache'}"]
    return prepare(root / "prepared", overrides, train_size=512, test_size=64)


def write_test_experiment(root: Path) -> Path:
    """``verl_cpu_tiny`` with the tests' short prepare step (SFT cached under ``root/sft-cache``), written to
    ``root/verl_cpu_test.yaml`` for a sweep's ``verl.experiment=``."""
    import yaml

    experiment = yaml.safe_load((EXPERIMENT_DIR / f"{EXPERIMENT}.yaml").read_text())
    experiment["prepare"]["overrides"] += [*TEST_PREPARE_OVERRIDES, f"sft.cache_dir={root / 'sft-cache'}"]
    experiment["prepare"].update(train_size=512, test_size=64)
    path = root / "verl_cpu_test.yaml"
    path.write_text(yaml.safe_dump(experiment))
    return path


@dataclass
class VerlRun:
    """A finished verl run: its exit code, run store and console log."""

    returncode: int
    run_dir: Path
    log: Path

    def tail(self, lines: int = 60) -> str:
        """The last lines of the console log (for assertion messages)."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def run_verl(prepared: Path, run_dir: Path, dataflex: Sequence[str] = (), extra: Sequence[str] = (),
             steps: int = 2, environment: Mapping[str, str] | None = None, run_store: bool = True) -> VerlRun:
    """One verl CPU-mode run of ``steps`` steps writing its run store to ``run_dir`` (unless not ``run_store``);
    ``dataflex`` changes the experiment's dataflex block, ``extra`` are verl overrides (or experiment variables,
    ``trainer_mode=v0``) placed last, ``environment`` adds variables."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = build_verl_command(EXPERIMENT, list(dataflex), [
        f"prepared={prepared}", f"trainer.total_training_steps={steps}",
        *([f"+dataflex_run.dir={run_dir}"] if run_store else []),
        f"trainer.default_local_dir={run_dir / 'checkpoints'}", *extra,
    ])
    environment = {**os.environ, **experiment_environment(EXPERIMENT), **(environment or {})}
    environment.pop("RAY_ADDRESS", None)  # a fresh local Ray cluster per run
    log = run_dir / "verl.log"
    with log.open("a") as output:
        completed = subprocess.run(command, cwd=run_dir, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S, check=False)
    return VerlRun(completed.returncode, run_dir, log)
