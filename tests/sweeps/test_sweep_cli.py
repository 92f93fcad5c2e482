"""The small things of the sweep command lines: plain help text, Hydra's --cfg job, make help."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from sweeps import tune
from sweeps.cli import main, split_cfg_flag

from .conftest import REPO


def test_help_is_plain_text(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("python -m sweeps [key=value ...]: run an alpha x seed sweep")
    assert "``" not in text and "::" not in text and "alpha=0.0,0.25,0.5" in text
    assert tune.main(["-h"]) == 0
    assert "``" not in capsys.readouterr().out


@pytest.mark.parametrize("entry", [main, tune.main])
def test_cfg_job_prints_the_composed_config(entry, capsys):
    assert entry(["--cfg", "job", "seeds=3,4"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["seeds"] == [3, 4]


def test_split_cfg_flag():
    assert split_cfg_flag(["--cfg", "job", "a=1"]) == (True, ["a=1"])
    assert split_cfg_flag(["a=1", "--cfg"]) == (True, ["a=1"])
    assert split_cfg_flag(["job=1"]) == (False, ["job=1"])


def test_make_help_lists_the_sweep_variables():
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    text = subprocess.run(["make", "-o", ".venv/.installed", "help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True).stdout
    for name in ("ALPHA", "SEEDS", "MECH", "ETA", "STEPS", "JOBS", "SWEEP", "BACKEND", "LAUNCHER", "DRY_RUN", "EXTRA"):
        assert f"{name} " in text, name
    assert "notebook" in text


def test_make_sweep_runs_the_driver_through_sweeps_make():
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    text = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed", "sweep", "ALPHA=0.0,0.5",
                           "SEEDS=1,2", "EXTRA=trainer.lr=1e-4,3e-4 sft.steps=20"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True).stdout.strip()
    assert text.endswith("-m sweeps.make sweep")  # the values travel in the environment (tests/sweeps/test_sweep_make.py)
    assert "alpha" not in text and "trainer.lr" not in text
