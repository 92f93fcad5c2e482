"""Sweep driver tests: tiny real runs (2-3 RL steps) or the scripted stand-in trainer, everything in tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTED_TRAIN = "tests.sweeps.scripted_train"


def tiny_extra(cache_dir: Path) -> str:
    """``extra=[...]`` for 2-3-step real runs that take seconds (W&B off, a tmp SFT cache)."""
    overrides = ["trainer.val_every=1", "trainer.prompts_per_step=4", "trainer.rollouts_per_prompt=2",
                 "trainer.val_size=8", "trainer.save_every=1", "sft.steps=2", "logger.wandb.mode=disabled",
                 "stats.exact_every=0", f"sft.cache_dir={cache_dir}"]
    return "extra=[" + " ".join(overrides) + "]"


def plan_of(config):
    """The driver's plan of ``config`` (its grid expanded, its name or the default one)."""
    from sweeps.grid import default_name, expand_grid
    from sweeps.plan import plan_sweep

    return plan_sweep(config, config.name or default_name(config), expand_grid(config))[0]


def read_manifest(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "sweep.json").read_text())


def runs_by_name(sweep_dir: Path) -> dict[str, dict]:
    return {entry["run"]: entry for entry in read_manifest(sweep_dir)["runs"]}


def start_driver(argv: list[str], cwd: Path, module: str = "sweeps") -> subprocess.Popen:
    """``python -m sweeps <argv>`` in the background (a process of its own, so signals reach only it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", module, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for(condition: Callable[[], object], timeout: float = 120.0, what: str = "condition") -> object:
    """Poll ``condition`` until it returns something truthy (a test helper, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def sft_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sweep-sft-cache")


@pytest.fixture
def repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Child processes find ``tests.sweeps.scripted_train`` whatever their working directory."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
