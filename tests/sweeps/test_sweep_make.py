"""The Makefile's variables reach the commands as data (sweeps/make.py): nothing a value holds is run by a shell."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import make

from .conftest import REPO


def values(**given: str) -> dict[str, str]:
    return make.variables({make.ENV_PREFIX + name: value for name, value in given.items()})


def test_the_makefile_exports_exactly_the_variables_sweeps_make_reads():
    text = (REPO / "Makefile").read_text()
    listed = re.search(r"^MAKE_VARIABLES := ((?:.*\\\n)*.*)$", text, re.M).group(1)
    assert tuple(listed.replace("\\\n", " ").split()) == make.VARIABLES
    recipes = [line for line in text.splitlines() if line.startswith("\t")]
    for name in make.VARIABLES:  # no recipe pastes a variable into its shell line
        assert not any(f"$({name})" in line or f"${{{name}}}" in line for line in recipes), name


def test_sweep_variables_become_one_argument_each():
    argv = make.sweep_argv(values(ALPHA="0.0,0.5", SEEDS="1,2", BACKEND="local", LAUNCHER="process",
                                  EXTRA="trainer.lr=1e-4,3e-4 sft.steps=20", SWEEP_ARGS="threads=2 'root=a b'"))
    assert argv == ["alpha=0.0,0.5", "seeds=1,2", "backend=local", "launcher=process",
                    "extra=[trainer.lr=1e-4,3e-4 sft.steps=20]", "threads=2", "root=a b"]
    hostile = make.sweep_argv(values(SWEEP="a;touch pwned", EXTRA="x]' ; touch p4 ; echo '[", DRY_RUN="1"))
    assert hostile == ["name=a;touch pwned", "extra=[x]' ; touch p4 ; echo '[]", "dry_run=true"]
    assert make.tune_argv(values(SWEEP="t", LR="1", DRY_RUN="yes", LAUNCHER="process")) == [
        "name=t", "launcher=process", "tune_lr=true", "dry_run=true"]
    assert make.command("train", values(ARGS="seed=3 'run_dir=a b'"))[1:] == [
        "-m", "dataflex_rl.local.train", "seed=3", "run_dir=a b"]


def test_a_switch_that_is_not_on_or_off_is_refused():
    assert make.sweep_argv(values(DRY_RUN="0")) == []
    with pytest.raises(make.ConfigError, match=r"DRY_RUN = 'maybe' is not allowed"):
        make.sweep_argv(values(DRY_RUN="maybe"))
    with pytest.raises(make.ConfigError, match=r"SWEEP_ARGS = \"'a\" is not allowed"):
        make.sweep_argv(values(SWEEP_ARGS="'a"))


def test_report_and_notebook_folders_come_from_sweep():
    assert make.sweep_folder(values(SWEEP="demo")) == os.path.join("runs", "demo")
    with pytest.raises(make.ConfigError, match=r"SWEEP = '\.\./x' is not allowed"):
        make.sweep_folder(values(SWEEP="../x"))


@pytest.mark.parametrize(("name", "message"), [
    ("a" * 300, r"RESULTS = 'a{20}'\.\.\. \(300 characters\) is not allowed: .* at most 128 characters"),
    ("..", r"RESULTS = '\.\.' is not allowed: a results name .* starting with a letter or digit"),
    (".", r"RESULTS = '\.' is not allowed: a results name"),
    ("-rf", r"RESULTS = '-rf' is not allowed: a results name"),  # was read by argparse as an option
    ("Results", r"RESULTS = 'Results' is not allowed: the file's first line, .* would start like a block marker"),
])
def test_make_docs_results_refuses_a_results_name_that_is_not_a_plain_file_name(name, message):
    with pytest.raises(make.ConfigError, match=message):
        make.command("docs-results", values(SWEEP="demo", RESULTS=name))
    assert make.command("docs-results", values(SWEEP="demo", RESULTS="v2.1_final"))[1:] == [
        "-m", "analysis.results", os.path.join("runs", "demo"), "--name=v2.1_final"]


def _make(tmp_path: Path, *variables: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.fail("make is not installed")
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "sweep", f"PY={sys.executable}",
                           "ALPHA=0.5", "SEEDS=1", "STEPS=3", *variables], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("variable", [
    "SWEEP=;touch {marker};false",
    "SWEEP=`touch {marker}`",
    "SWEEP=$$(touch {marker})",
    "SWEEP=$(shell touch {marker})",
    "EXTRA=x]' ; touch {marker} ; echo '[",
    "SWEEP_ARGS=root=x;touch {marker}",
])
def test_no_make_variable_is_run_by_a_shell(tmp_path, variable):
    marker = tmp_path / "pwned"
    before = sorted(path.name for path in REPO.iterdir())
    result = _make(tmp_path, variable.format(marker=marker), "DRY_RUN=1")
    assert not marker.exists(), result.stdout + result.stderr
    assert sorted(path.name for path in REPO.iterdir()) == before  # no file named dry_run=true, no runs/ folder
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nothing was started" in result.stderr


def test_make_alpha_range_is_refused_naming_alpha(tmp_path):
    result = _make(tmp_path, "ALPHA=range(0,1)", "DRY_RUN=1")
    assert result.returncode == 2
    assert "syntax error" not in result.stderr
    assert "alpha = 'range(0,1)' is not allowed" in result.stderr


def test_make_dry_run_prints_the_command_and_starts_nothing(tmp_path):
    result = _make(tmp_path, "SWEEP=dry", f"SWEEP_ARGS=root={tmp_path / 'runs'}", "DRY_RUN=1")
    assert result.returncode == 0, result.stderr
    assert f"-m sweeps alpha=0.5 seeds=1 steps=3 name=dry root={tmp_path / 'runs'} dry_run=true" in result.stdout
    assert not (tmp_path / "runs" / "dry").exists()


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("MECH", "ar", "make tune searches alpha itself, on one preset; pick it with EXTRA=\"dataflex=<preset>\""),
    ("ALPHA", "0.5", "make tune searches alpha itself"),
    ("ETA", "0.3", "make tune searches alpha itself, with no eta axis"),
    ("TARGET_MDE", "0.01", "make tune runs a fixed number of seeds per trial (SEEDS), it plans none"),
    ("MAX_SEEDS", "10", "make tune runs a fixed number of seeds per trial (SEEDS), it plans none"),
    ("EXPERIMENT", "kk", "a named experiment's grid sweeps presets, which a study does not; tune alpha on the "
                         "experiment's runs with EXTRA=\"experiment=<name>\""),
])
def test_make_tune_refuses_each_variable_it_would_ignore(variable, value, reason, monkeypatch, capsys):
    """make tune MECH=ar (and ALPHA, ETA, TARGET_MDE, MAX_SEEDS, EXPERIMENT): each was silently dropped"""
    executed = []
    monkeypatch.setattr(make.os, "execv", lambda *argv: executed.append(argv))
    monkeypatch.setenv(make.ENV_PREFIX + variable, value)
    assert make.main(["tune"]) == 2
    assert executed == []  # nothing run
    error = capsys.readouterr().err
    assert f"error: make tune refused, nothing was started: make tune: {variable} = '{value}' is not allowed: " \
           f"{reason}" in error


def test_make_tune_passes_what_the_study_honours_and_names_every_variable():
    """make tune BACKEND=verl VERL_EXPERIMENT=verl_cpu_tiny (BACKEND was dropped, though the study runs on it)"""
    argv = make.tune_argv(values(BACKEND="verl", VERL_EXPERIMENT="verl_cpu_tiny", LAUNCHER="process", SEEDS="1,2"))
    assert argv == ["seeds=1,2", "backend=verl", "launcher=process", "verl.experiment=verl_cpu_tiny"]
    switches_and_lists = {"LR", "DRY_RUN", "EXTRA", "SWEEP_ARGS"}
    passed = {name for name, _ in make.TUNE_KEYS}
    assert set(make.VARIABLES) == passed | set(make.TUNE_REFUSED) | switches_and_lists  # none silently dropped


def test_every_default_make_help_states_is_the_schemas():
    """The "(default X)" of each ``#>`` line: a value of the sweep schema (resolved, as a sweep with no arguments
    gets it) or of the launcher's settings, or a rule the driver applies (JOBS, SWEEP)."""
    from sweeps.backends import get_backend
    from sweeps.cli import load_config
    from sweeps.sweep_config import grid_alphas, run_steps
    from sweeps.launchers import launcher_class

    lines = [line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith("#> ")]
    stated = dict(re.findall(r"^#> (\w+)\s.*\(default:? ([^)]*)\)", "\n".join(lines), flags=re.M))
    config = load_config([])[1]
    assert stated == {
        "ALPHA": ",".join(map(str, grid_alphas(config))), "SEEDS": ",".join(map(str, config.seeds)),
        "STEPS": f"{run_steps(config)} on the local backend", "WARM_START": config.warm_start,
        "BACKEND": config.backend, "VERL_EXPERIMENT": get_backend("verl").settings().experiment, "LAUNCHER": config.launcher,
        "JOBS": "the core count; 1 in verl's CPU mode, whose runs each start a Ray cluster on every core",
        "SWEEP": "a hash of the grid",
    }
    assert run_steps(config) == config.backend_settings.steps and config.backend == "local"
    slurm = launcher_class("slurm").settings()
    for key, value in re.findall(r"slurm\.(\w+)=([\d.]+)", "\n".join(lines)):
        assert float(getattr(slurm, key)) == float(value), key
