"""Short real runs of the local backend: tiny settings, a shared SFT cache per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataflex_rl.compose import compose_train_config

REPO = Path(__file__).resolve().parents[2]


def tiny_overrides(run_dir: Path, cache_dir: Path, steps: int = 3) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"sft.cache_dir={cache_dir}",
        # One-digit addition learns enough in 60 tiny SFT steps to earn some reward, so updates are not all zero.
        "task.max_digits=1",
        "task.test_size=20",
        "sft.steps=60",
        "sft.batch_size=32",
        "sft.lr=3e-3",
        f"trainer.total_steps={steps}",
        "trainer.val_every=2",
        "trainer.prompts_per_step=4",
        "trainer.rollouts_per_prompt=4",
        "trainer.val_size=8",
        "trainer.save_every=1",
        "stats.exact_every=2",
        "stats.exact_samples=4",
        "logger.wandb.mode=disabled",
        "logger.hist_every=1",
        "threads=1",
    ]


def compose_train(overrides: list[str]) -> dict:
    return compose_train_config(overrides)


def run_cli(overrides: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "dataflex_rl.local.train", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="session")
def sft_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sft-cache")
