"""Launchers as a registry with one Hydra file each, and the sweep session that the grid driver and the Optuna
search share (lock, sweep.json, invocation record, exit code)."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

import pytest
from filelock import FileLock

import sweeps.launchers
from dataflex_rl.validation import ConfigError
from sweeps import cli as sweep_cli
from sweeps import sweep_config
from sweeps.cli import load_config
from sweeps.cli import main as sweep_main
from sweeps.launchers import LAUNCHERS, discover
from sweeps.plan import SweepPlan
from sweeps.runner import SessionRefused, SweepSession, SweepStopped
from sweeps.tune import main as tune_main
from tests import registry_snapshot

from .conftest import SCRIPTED_TRAIN, read_manifest

LAUNCHER_CONF = sweep_config.SWEEP_CONF_DIR / "launcher"


def config_of(*argv: str):
    return load_config(list(argv))[1]


def standin_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["alpha=0.5", "seeds=1", "steps=2", f"root={tmp_path / 'runs'}", "name=shared",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", "poll_s=0.05", *more]


def tune_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["name=shared", f"root={tmp_path / 'runs'}", "seeds=1", "steps=2", "n_trials=1",
            "search=[{name: alpha, type: float, low: 0.0, high: 1.0}]", "enqueue=[{alpha: 0.5}]",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "poll_s=0.05", *more]


# --- launchers: registry, one YAML each ----------------------------------------------------------------------------
def test_every_registered_launcher_has_one_yaml_and_every_yaml_a_launcher():
    assert sorted(path.stem for path in LAUNCHER_CONF.glob("*.yaml")) == LAUNCHERS.names()
    assert LAUNCHERS.names() == ["process", "ray", "slurm"]
    for name in LAUNCHERS.names():
        config = config_of(f"launcher={name}")
        assert config.launcher == name
        settings_type = LAUNCHERS.get(name).settings
        assert (config.launcher_settings is None) == (settings_type is None)
    assert config_of().launcher == "process"  # the defaults list of conf/sweeps/default.yaml


@pytest.mark.parametrize(("argv", "named"), [
    (["slurm.partition=gpu"], "slurm.partition = 'gpu' is not allowed with launcher=process"),
    (["launcher=slurm", "ray.address=http://x:8265"], "add launcher=ray"),
    (["launcher=slurm", "+slurm.nodes=2"], "slurm: unknown key(s) 'nodes'; allowed keys: cluster"),
    (["launcher=k8s"], "registered launchers: process, ray, slurm"),
    (["verl.experiment=verl_cpu_tiny"], "verl.experiment = 'verl_cpu_tiny' is not allowed with backend=local: "
                                        "verl.* are the settings of backend=verl"),
    (["backend=verl", "local.steps=3"], "local.steps = '3' is not allowed with backend=verl"),
    (["+local.stepz=3"], "local: unknown key(s) 'stepz'; allowed keys: steps, sft_warm_start"),
    (["local.steps=0"], "local.steps = 0 is not allowed: it must be an integer >= 1"),
    (["local.sft_warm_start=maybe"], "local.sft_warm_start = 'maybe' is not allowed: it must be true or false"),
    (["backend=k8s"], "backend = 'k8s' is not allowed; allowed values: 'local', 'verl'"),
    (["backend=verl", "verl.experiment=verl_kk_7b"], "verl.experiment = 'verl_kk_7b' is not allowed: no such file, "
                                                     "and no verl_kk_7b.yaml"),
])
def test_settings_are_checked_against_the_chosen_launcher_and_backend(argv, named):
    with pytest.raises(ConfigError) as caught:
        config_of(*argv)
    assert named in str(caught.value)


def test_a_backend_brings_its_own_settings_block_with_the_dataclass_defaults():
    from sweeps.backends.local import LocalSettings
    from sweeps.backends.verl import VerlSettings

    assert config_of().backend_settings == LocalSettings() == LocalSettings(steps=120, sft_warm_start=True)
    assert sweep_config.run_steps(config_of("local.steps=7")) == 7  # the local backend's default for steps
    assert config_of("local.sft_warm_start=false").backend_settings.sft_warm_start is False
    verl = config_of("backend=verl", "verl.experiment=verl_cpu_tiny")
    assert verl.backend_settings == VerlSettings(experiment="verl_cpu_tiny")
    assert config_of("backend=verl").backend_settings.experiment == "verl_kk_3b"


ECHO_MODULE = '''
import dataclasses

from sweeps.launchers.base import LAUNCHERS
from sweeps.launchers.process import ProcessLauncher


@dataclasses.dataclass(frozen=True)
class EchoSettings:
    """The settings block ``echo:``."""

    tag: str = "none"


@LAUNCHERS.register("echo")
class EchoLauncher(ProcessLauncher):
    """Child processes, each launch recording its tag (a launcher added as one file)."""

    name = "echo"
    settings = EchoSettings

    @classmethod
    def from_config(cls, settings, sweep_dir, sweep, parallelism):
        launcher = cls()
        launcher.tag = settings.tag
        return launcher

    def launch(self, runs):
        jobs = super().launch(runs)
        for job in jobs:
            job.info["tag"] = self.tag
        return jobs
'''

ECHO_YAML = """# @package _global_
defaults:
  - /launcher_settings@echo: echo
launcher: echo
"""


@pytest.fixture
def echo_launcher(tmp_path, monkeypatch):
    """A launcher added the documented way: one module in sweeps/launchers/ (here a folder added to the package's
    path) and one YAML in conf/sweeps/launcher/ (here a copy of conf/sweeps)."""
    package_dir = tmp_path / "launcher_package"
    package_dir.mkdir()
    (package_dir / "echo.py").write_text(ECHO_MODULE)
    conf_dir = tmp_path / "conf_sweeps"
    shutil.copytree(sweep_config.SWEEP_CONF_DIR, conf_dir)
    (conf_dir / "launcher" / "echo.yaml").write_text(ECHO_YAML)
    monkeypatch.setattr(sweeps.launchers, "__path__", [*sweeps.launchers.__path__, str(package_dir)])
    monkeypatch.setattr(sweep_config, "SWEEP_CONF_DIR", conf_dir)
    monkeypatch.setattr(sweep_cli, "SWEEP_CONF_DIR", conf_dir)  # where the command line composes the sweep config
    with registry_snapshot(LAUNCHERS):
        try:
            assert "echo" in discover()
            yield conf_dir
        finally:
            sys.modules.pop("sweeps.launchers.echo", None)


def test_a_launcher_added_as_one_module_and_one_yaml_runs_a_sweep(tmp_path, echo_launcher, repo_on_path):
    assert config_of("launcher=echo").launcher_settings.tag == "none"
    with pytest.raises(ConfigError, match=r"echo: unknown key\(s\) 'colour'; allowed keys: tag"):
        config_of("launcher=echo", "+echo.colour=red")
    assert sweep_main(standin_argv(tmp_path, "launcher=echo", "echo.tag=hello")) == 0
    manifest = read_manifest(tmp_path / "runs" / "shared")
    assert manifest["launcher"] == "echo"
    assert [entry["launch"]["tag"] for entry in manifest["runs"]] == ["hello", "hello"]  # alpha 0 and 0.5
    assert {entry["state"] for entry in manifest["runs"]} == {"completed"}


def test_a_registered_launcher_without_its_yaml_is_refused_naming_the_file(echo_launcher):
    (echo_launcher / "launcher" / "echo.yaml").unlink()
    with pytest.raises(ConfigError, match="no config file conf/sweeps/launcher/echo.yaml"):
        config_of("launcher=echo")


# --- the session shared by the grid driver and the Optuna search ---------------------------------------------------
@pytest.mark.parametrize(("main", "argv", "kind"), [(sweep_main, standin_argv, "sweep"),
                                                    (tune_main, tune_argv, "study")])
def test_both_drivers_refuse_a_second_driver_on_the_same_folder(tmp_path, capsys, main, argv, kind):
    sweep_dir = tmp_path / "runs" / "shared"
    sweep_dir.mkdir(parents=True)
    lock = FileLock(sweep_dir / ".sweep.lock")
    lock.acquire(timeout=0)  # another driver holds the folder
    try:
        assert main(argv(tmp_path)) == 2
    finally:
        lock.release()
    assert f"error: {kind} shared is being run by another driver" in capsys.readouterr().err
    assert not (sweep_dir / "sweep.json").exists()  # nothing was started or recorded


@pytest.mark.parametrize(("main", "argv"), [(sweep_main, standin_argv), (tune_main, tune_argv)])
def test_both_drivers_record_each_invocation_in_sweep_json(tmp_path, repo_on_path, main, argv):
    assert main(argv(tmp_path)) == 0
    assert main(argv(tmp_path)) == 0  # the same command again: nothing left to run, one more invocation
    manifest = read_manifest(tmp_path / "runs" / "shared")
    assert manifest["state"] == "completed"
    assert [entry["exit_code"] for entry in manifest["invocations"]] == [0, 0]
    assert all(entry["end"] and entry["argv"] == argv(tmp_path) for entry in manifest["invocations"])
    assert {entry["state"] for entry in manifest["runs"]} == {"completed"}
    FileLock(tmp_path / "runs" / "shared" / ".sweep.lock").acquire(timeout=0)  # released: free to take


def empty_plan(tmp_path: Path, *argv: str) -> SweepPlan:
    config = config_of("alpha=0.5", "seeds=1", f"root={tmp_path}", "name=unit", *argv)
    return SweepPlan(name="unit", sweep_dir=tmp_path / "unit", config=config, jobs=1, threads=1, warm_starts=[],
                     runs=[])


def test_a_stop_signal_becomes_128_plus_its_number_and_the_sweep_is_recorded_interrupted(tmp_path):
    def stopped(runner):
        raise SweepStopped(signal.SIGTERM)

    with SweepSession(empty_plan(tmp_path), ["alpha=0.5"]) as session:
        assert session.run(stopped) == 128 + signal.SIGTERM
        assert session.run(lambda runner: 0) == 128 + signal.SIGTERM  # a later success never hides it
    manifest = json.loads((tmp_path / "unit" / "sweep.json").read_text())
    assert manifest["state"] == "interrupted"
    assert manifest["invocations"][-1]["exit_code"] == 143 and manifest["invocations"][-1]["argv"] == ["alpha=0.5"]


def test_a_refused_session_writes_nothing_and_releases_the_lock(tmp_path):
    with SweepSession(empty_plan(tmp_path, "steps=2"), []) as session:
        session.run(lambda runner: 0)
    before = (tmp_path / "unit" / "sweep.json").read_text()
    with pytest.raises(SessionRefused, match="sweep refused, nothing was started: sweep unit was run with other "
                                              "settings: steps: recorded 2, now 3"):
        with SweepSession(empty_plan(tmp_path, "steps=3"), []):
            pass
    assert (tmp_path / "unit" / "sweep.json").read_text() == before
    with SweepSession(empty_plan(tmp_path, "steps=2"), []) as session:  # the lock was released
        session.run(lambda runner: 0)
    assert len(json.loads((tmp_path / "unit" / "sweep.json").read_text())["invocations"]) == 2
