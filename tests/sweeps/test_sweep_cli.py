"""The small things of the sweep command lines: plain help text, Hydra's --cfg job, make help."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from sweeps import tune
from sweeps.cli import main, split_cfg_flag

from .conftest import REPO, SCRIPTED_TRAIN


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


# --- values refused where they enter, before any run starts (exit 2, nothing written) -------------------------------
def _refused(argv: list[str], tmp_path, capsys) -> str:
    """``python -m sweeps <argv>`` under ``root=<tmp_path>/runs``: exit 2, nothing written; the error's text."""
    root = tmp_path / "runs"
    assert main([*argv, f"root={root}", "name=hostile", "dry_run=true"]) == 2
    assert not root.exists()
    error = capsys.readouterr().err
    assert error.startswith("error: sweep refused, nothing was started: ")
    return error


def test_an_experiment_choice_that_is_a_path_is_refused_before_composing(tmp_path, capsys):
    """make sweep EXPERIMENT=../launcher/slurm (it switched the launcher: the launcher files are @package _global_)"""
    assert main(["experiment=../launcher/slurm", "--cfg", "job"]) == 2
    error = capsys.readouterr().err
    assert "experiment = '../launcher/slurm' is not allowed: an experiment is the name of a file" in error
    assert "(a name, not a path); allowed: kk" in error
    assert "experiment = '../task/knights_knaves' is not allowed" in _refused(
        ["extra=[experiment=../task/knights_knaves]"], tmp_path, capsys)
    assert main(["experiment=kk", "--cfg", "job"]) == 0  # a name still works


@pytest.mark.parametrize(("extra", "group", "allowed"), [
    ("task=../experiment/kk", "task", "arithmetic, knights_knaves"),
    ("dataflex=../task/arithmetic", "dataflex", "ar, "),
    ("model=choice(tiny,../trainer/grpo)", "model", "tiny"),
])
def test_any_config_group_choice_that_is_a_path_is_refused(extra, group, allowed, tmp_path, capsys):
    """make sweep EXTRA="task=../experiment/kk" (a group choice is read as a path: another group's file, which may
    set any key, would be loaded as the task)"""
    error = _refused([f"extra=[{extra}]"], tmp_path, capsys)
    assert f"{group} = '../" in error and f"conf/{group}/<name>.yaml (a name, not a path); allowed: {allowed}" in error


@pytest.mark.parametrize("metric", ["baseline", "dataflex.actuator.params.alpha", "sft.seed"])
def test_a_plan_metric_that_is_a_config_key_is_refused_listing_metrics_only(metric, tmp_path, capsys):
    """make sweep TARGET_MDE=0.01 SEEDS=1,2,3 SWEEP_ARGS="plan_metric=baseline" (a pilot ran 4 runs before "no seed
    plan: 'baseline' was not logged")"""
    error = _refused([f"plan_metric={metric}", "target_mde=0.01", "seeds=1,2,3", f"train_module={SCRIPTED_TRAIN}",
                      "validate=false", "local.sft_warm_start=false"], tmp_path, capsys)
    assert f"plan_metric = '{metric}' is not allowed: not a metric the trainer logs" in error
    allowed = error.split("allowed: ", 1)[1]
    assert "val/accuracy" in allowed
    assert not any(key in allowed.split(", ") for key in ("baseline", "sft.seed", "dataflex.actuator.params.alpha",
                                                          "dataflex.actuator.params."))


@pytest.mark.parametrize("extra", ["trainer.lr=${trainer.total_steps}", "trainer.lr=${oc.decode:1}"])
def test_an_interpolation_that_does_not_resolve_is_refused_naming_the_key(extra, tmp_path, capsys):
    """make sweep EXTRA="trainer.lr=${trainer.total_steps}" DRY_RUN=1 (an omegaconf traceback, exit 1)"""
    error = _refused([f"extra=[{extra}]"], tmp_path, capsys)
    assert f"extra[0] = '{extra}' is not allowed: its interpolation cannot be resolved (" in error
    assert "Traceback" not in error


@pytest.mark.parametrize(("argument", "key", "value"), [
    ("alpha=1e-400", "alpha", "1e-400"),
    ("alpha=0.5,1e-400", "alpha", "0.5,1e-400"),
    ("eta=-1e-999", "eta", "-1e-999"),
    ("target_mde=1e-400", "target_mde", "1e-400"),
    ("extra=[trainer.lr=0.5e-330]", "extra", "trainer.lr=0.5e-330"),
])
def test_a_number_that_underflows_to_zero_is_refused_naming_the_key_and_value(argument, key, value, tmp_path, capsys):
    """make sweep ALPHA=1e-400 DRY_RUN=1 (became alpha 0.0: a sweep of the baseline alone)"""
    error = _refused([argument], tmp_path, capsys)
    number = value.rsplit(",", 1)[-1].rsplit("=", 1)[-1]
    assert f"{key} = '{value}' is not allowed: {number} is not 0 but below the smallest float" in error
    assert main(["alpha=0,5e-324", "--cfg", "job"]) == 0  # zero itself, and the smallest float, stay allowed


@pytest.mark.parametrize("max_seeds", ["5", "20"])
def test_max_seeds_without_target_mde_is_refused_naming_both(max_seeds, tmp_path, capsys):
    """make sweep MAX_SEEDS=5 DRY_RUN=1 (silently ignored: no plan without TARGET_MDE)"""
    error = _refused([f"max_seeds={max_seeds}"], tmp_path, capsys)
    assert f"max_seeds = {max_seeds} is not allowed without target_mde" in error
    from sweeps.cli import load_config
    from sweeps.sweep_config import DEFAULT_MAX_SEEDS, plan_cap

    assert plan_cap(load_config(["target_mde=0.01", "seeds=1,2,3"])[1]) == DEFAULT_MAX_SEEDS
    assert load_config([])[1].max_seeds is None
