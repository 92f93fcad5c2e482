"""Grid expansion, run names, command-line conveniences, validation messages, concurrency: no processes."""

from __future__ import annotations

import dataclasses

import json
from dataclasses import astuple
import time
from pathlib import Path

import pytest

from dataflex_rl.validation import ConfigError
from sweeps import plan as sweep_plan
from sweeps.cli import load_config
from sweeps.backends import get_backend
from sweeps.cli import normalize_argv, split_extra
from sweeps.grid import default_name
from sweeps.plan import concurrency
from sweeps.sweep_config import (common_overrides, extra_axes, grid_alphas, grid_presets, parse_extra,
                                 run_steps)
from sweeps.grid import expand_grid
from sweeps.manifest import Manifest
from sweeps.tune import final_window_mean
from sweeps.runner import SweepRunner, mark_run_store

from .conftest import REPO, plan_of


def config_of(*argv: str):
    return load_config(list(argv))[1]


def test_make_style_lists_become_hydra_lists():
    assert normalize_argv(["alpha=0.0,0.25,0.5", "seeds=1,2", "mechanisms=baseline,ar", "eta=0.1"]) == [
        "alpha=[0.0,0.25,0.5]", "seeds=[1,2]", "mechanisms=[baseline,ar]", "eta=0.1"]
    assert normalize_argv(["alpha=[0.5]", "name=a,b"]) == ["alpha=[0.5]", "name=a,b"]


def test_extra_from_make_is_split_at_spaces_and_sweeps_stay_whole():
    assert split_extra("trainer.lr=1e-3 sft.steps=2") == ["trainer.lr=1e-3", "sft.steps=2"]
    assert split_extra("trainer.lr=1e-3,sft.steps=2") == ["trainer.lr=1e-3", "sft.steps=2"]
    assert split_extra("trainer.lr=1e-4,1e-3") == ["trainer.lr=1e-4,1e-3"]
    assert split_extra("model.x=[1,2]") == ["model.x=[1,2]"]
    config = config_of("extra=[trainer.lr=1e-4,1e-3 sft.steps=2]")
    assert config.extra == ("trainer.lr=1e-4,1e-3", "sft.steps=2")
    assert config_of("extra=[]").extra == ()


def test_default_grid_adds_the_baseline_first_and_names_runs():
    config = config_of("alpha=0.25,0.5", "seeds=1,2")
    specs = expand_grid(config)
    assert [spec.name for spec in specs] == ["a0.0-s1", "a0.0-s2", "a0.25-s1", "a0.25-s2", "a0.5-s1", "a0.5-s2"]
    assert specs[2].overrides == ("++dataflex.actuator.params.alpha=0.25", "seed=1", "sft.seed=1")
    no_baseline = expand_grid(config_of("alpha=0.25,0.5", "seeds=1", "add_baseline=false"))
    assert [spec.alpha for spec in no_baseline] == [0.25, 0.5]
    # 0 and 0.0 are one value: no duplicate baseline.
    assert [spec.alpha for spec in expand_grid(config_of("alpha=0,0.5", "seeds=1"))] == [0.0, 0.5]


def test_an_actuator_parameters_axis_multiplies_only_the_presets_that_have_it():
    # MECH=high_entropy EXTRA="dataflex.actuator.params.rho=0.1,0.4": the baseline (added) has no rho, runs once.
    specs = expand_grid(config_of("mechanisms=high_entropy", "seeds=1",
                                  "extra=[dataflex.actuator.params.rho=0.1,0.4]"))
    assert [spec.name for spec in specs] == ["s1-baseline", "s1-high_entropy-rho0.1", "s1-high_entropy-rho0.4"]
    assert "dataflex.actuator.params.rho=0.1" not in specs[0].overrides
    assert specs[1].overrides[-3:] == ("dataflex.actuator.params.rho=0.1", "seed=1", "sft.seed=1")
    assert specs[0].axis_keys == ("mechanism_label", "dataflex.actuator.params.rho", "seed")
    # A parameter the actuator has without the preset setting it (Lopti's split) is an axis of that preset too.
    split = expand_grid(config_of("mechanisms=lopti", "seeds=1", "extra=[dataflex.actuator.params.split=threshold,"
                                  "quantile]"))
    assert [spec.name for spec in split] == ["s1-baseline", "s1-lopti-split-threshold", "s1-lopti-split-quantile"]


def test_extra_axes_mechanisms_and_eta_multiply_the_grid():
    config = config_of("alpha=0.5", "seeds=1", "add_baseline=false", "mechanisms=baseline,ar",
                       "extra=[trainer.lr=1e-4,1e-3 task=arithmetic,knights_knaves trainer.kl_coef=0.0]")
    specs = expand_grid(config)
    assert len(specs) == 2 * 2 * 2
    first = specs[0]
    assert first.name == "a0.5-s1-baseline-lr0.0001-task-arithmetic"
    assert first.overrides == ("dataflex=baseline", "mechanism_label=baseline", "++dataflex.actuator.params.alpha=0.5",
                               "trainer.lr=0.0001", "task=arithmetic", "seed=1", "sft.seed=1")
    assert [str(item) for item in parse_extra(config.extra)[0]] == ["trainer.kl_coef=0.0"]
    # eta multiplies only the presets whose actuator has an eta.
    mixed = expand_grid(config_of("alpha=0.5", "add_baseline=false", "seeds=1", "mechanisms=ar,lopti",
                                  "eta=0.25,0.75"))
    assert [spec.name for spec in mixed] == ["a0.5-s1-ar", "a0.5-s1-lopti-eta0.25", "a0.5-s1-lopti-eta0.75"]
    eta = expand_grid(config_of("alpha=[]", "seeds=1", "eta=0.1,0.5"))
    assert [spec.name for spec in eta] == ["s1-eta0.1", "s1-eta0.5"]
    assert eta[0].overrides == ("++dataflex.actuator.params.eta=0.1", "seed=1", "sft.seed=1")


@pytest.mark.parametrize(("argv", "named"), [
    (["alpha=0.5,abc"], "alpha = 'abc'"),
    (["seeds=1,-2"], "seeds = -2"),
    (["seeds=[]"], "seeds = []"),
    (["backend=jax"], "backend = 'jax'"),
    (["launcher=k8s"], "launcher = 'k8s'"),
    (["jobs=0"], "jobs = 0"),
    (["steps=0"], "steps = 0"),
    (["name=../escape"], "name = '../escape'"),
    (["mechanisms=no_such_preset"], "mechanisms = 'no_such_preset'"),
    (["extra=[seed=3]"], "seeds=1,2"),
    (["extra=[run_dir=/x]"], "run_dir"),
    (["extra=[dataflex.actuator.params.alpha=0.3]"], "alpha=0.0,0.5"),
    (["slurm.cluster=pbs"], "slurm.cluster = 'pbs'"),
    (["nonsense=1"], "nonsense"),
])
def test_bad_sweep_values_are_refused_naming_them(argv, named):
    with pytest.raises(ConfigError) as caught:
        config = config_of(*argv)
        expand_grid(config)
    assert named in str(caught.value)


def test_concurrency_never_oversubscribes_and_a_lone_run_gets_the_measured_default(monkeypatch):
    monkeypatch.setattr(sweep_plan, "available_cores", lambda: 8)
    assert astuple(concurrency(config_of(), runs=6))[:2] == (6, 1)  # jobs = min(cores, runs), one thread each
    assert astuple(concurrency(config_of("jobs=2"), runs=6))[:2] == (2, 1)  # more than one run live: 1 thread
    assert astuple(concurrency(config_of("jobs=3", "threads=2"), runs=6))[:2] == (3, 2)  # threads=N wins
    assert astuple(concurrency(config_of(), runs=2))[:2] == (2, 1)  # never more jobs than runs
    assert astuple(concurrency(config_of("jobs=1"), runs=6))[:2] == (1, sweep_plan.SINGLE_RUN_THREADS)
    assert astuple(concurrency(config_of(), runs=1))[:2] == (1, sweep_plan.SINGLE_RUN_THREADS)
    assert astuple(concurrency(config_of("launcher=slurm", "slurm.cpus_per_task=16"), runs=6))[:2] == (6, 16)
    assert astuple(concurrency(config_of("launcher=ray"), runs=6))[:2] == (6, 1)
    assert astuple(concurrency(config_of("backend=verl", "launcher=ray"), runs=6))[:2] == (6, None)
    assert concurrency(config_of("jobs=1"), runs=6).note == f"1 run(s) at once, {sweep_plan.SINGLE_RUN_THREADS} thread(s) per run (default)"
    assert concurrency(config_of("launcher=slurm"), runs=6).note.endswith("8 thread(s) per run (slurm.cpus_per_task)")


def test_default_name_is_stable_for_the_same_grid_and_differs_otherwise():
    first, again = default_name(config_of("alpha=0.5")), default_name(config_of("alpha=0.5", "jobs=1"))
    other = default_name(config_of("alpha=0.25"))
    assert first == again != other and first.startswith("sweep-")


def test_commands_carry_threads_run_dir_and_identity(tmp_path):
    config = config_of("alpha=0.5", "seeds=3", "steps=7", "jobs=2", "threads=1", f"root={tmp_path}", "name=demo",
                       "validate=false", "extra=[trainer.val_every=1]")
    runs = get_backend(config.backend).plan(config, expand_grid(config), "demo", tmp_path / "demo", threads=1)
    command = runs[1].command
    assert command[1:3] == ("-m", "dataflex_rl.local.train")
    assert command[3:] == ("trainer.total_steps=7", "trainer.val_every=1", "++dataflex.actuator.params.alpha=0.5",
                           "seed=3", "sft.seed=3", "axes=[dataflex.actuator.params.alpha,seed]",
                           f"run_dir={tmp_path / 'demo' / 'a0.5-s3'}", "sweep=demo", "run_name=a0.5-s3",
                           "warm_start=per_seed", "threads=1")
    assert runs[1].env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VERL_USE_EXTERNAL_PLUGINS": "none"}
    assert runs[1].log_path == (tmp_path / "demo" / "logs" / "a0.5-s3.log").resolve()


def test_one_warm_start_unless_an_axis_changes_the_sft_inputs(tmp_path):
    config = config_of("alpha=0.5", "seeds=1,2", "validate=false", "extra=[trainer.lr=1e-4,1e-3]",
                       "warm_start=shared")
    assert len(get_backend(config.backend).warm_starts(config, expand_grid(config), tmp_path, threads=2)) == 1
    warm = get_backend(config.backend).warm_starts(config, expand_grid(config), tmp_path, threads=2)[0]
    assert "mode=sft" in warm.command and "threads=2" in warm.command
    config = config_of("alpha=0.5", "seeds=1", "validate=false", "extra=[task=arithmetic,knights_knaves]",
                       "warm_start=shared")
    warm_starts = get_backend(config.backend).warm_starts(config, expand_grid(config), tmp_path, threads=2)
    assert [w.command[3:5] for w in warm_starts] == [("task=arithmetic", "mode=sft"),
                                                     ("task=knights_knaves", "mode=sft")]
    off = config_of("local.sft_warm_start=false")
    assert get_backend(off.backend).warm_starts(off, expand_grid(config), tmp_path, threads=2) == []


def test_steps_and_an_extra_total_steps_together_are_refused(tmp_path):
    config = config_of("steps=3", "validate=false", "extra=[trainer.total_steps=5]")
    with pytest.raises(ConfigError, match="steps = 3 is not allowed together with extra trainer.total_steps"):
        get_backend(config.backend).plan(config, expand_grid(config), "x", tmp_path, threads=1)


def test_manifest_keeps_earlier_runs_and_writes_atomically(tmp_path):
    first = Manifest(tmp_path, {"sweep": "demo"})
    first.entry("a0.0-s1", {"state": "completed", "alpha": 0.0})
    first.save()
    second = Manifest(tmp_path, {"sweep": "demo"})
    second.entry("a0.5-s1", {"state": "failed"})
    second.save()
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert [(e["run"], e["state"]) for e in data["runs"]] == [("a0.0-s1", "completed"), ("a0.5-s1", "failed")]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_dead_runs_running_status_is_marked(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "step": 4, "updated": "x", "error": None,
                                                      "traceback": None}))
    mark_run_store(tmp_path, "failed", "process ended by signal SIGKILL (exit code -9)")
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["state"], status["step"]) == ("failed", 4) and "SIGKILL" in status["error"]
    (tmp_path / "status.json").write_text(json.dumps({"state": "completed", "step": 4}))
    mark_run_store(tmp_path, "failed", "x")
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "completed"


def test_final_metric_reads_the_last_logged_value(tmp_path):
    lines = [{"step": 0, "val/accuracy": 0.25}, {"step": 1, "critic/score/mean": 1.0},
             {"step": 2, "val/accuracy": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert final_window_mean(tmp_path, "val/accuracy", window=1) == 0.75
    assert final_window_mean(tmp_path, "actor/grad_norm", window=1) is None


def planned(tmp_path, *argv: str):
    config = config_of("alpha=0.5", "seeds=1", "add_baseline=false", "validate=false", f"root={tmp_path}",
                       "name=demo", *argv)
    plan = plan_of(config)
    return plan, Manifest(plan.sweep_dir, plan.header())


def test_completed_runs_are_skipped_from_the_run_store_never_from_sweep_json_alone(tmp_path):
    from sweeps.launchers.process import ProcessLauncher

    plan, manifest = planned(tmp_path)
    run = plan.runs[0]
    runner = SweepRunner(plan, ProcessLauncher(), manifest)
    assert runner.pending_runs(plan.runs) == [run]
    # No run folder (deleted, or never written): sweep.json's completed state does not make it completed (a verl
    # run's own folder without a run store has its own rule: tests/sweeps/test_sweep_record_checks.py).
    manifest.entry(run.name, {"state": "completed", "exit_code": 0})
    assert runner.pending_runs(plan.runs) == [run]
    # A run store wins over sweep.json.
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "status.json").write_text(json.dumps({"state": "failed", "step": 1}))
    assert runner.pending_runs(plan.runs) == [run]
    assert manifest.previous(run.name)["state"] == "pending"


def test_a_run_still_alive_from_an_earlier_driver_refuses_the_resume(tmp_path):
    import subprocess
    import sys

    from sweeps.launchers.process import ProcessLauncher

    plan, manifest = planned(tmp_path)
    # the run's own command (a sleeper here): the launcher knows its process by that command line
    run = dataclasses.replace(plan.runs[0], command=(sys.executable, "-c", "import time; time.sleep(60)",
                                                     f"run_dir={plan.runs[0].run_dir}"))
    plan.runs[0] = run
    orphan = subprocess.Popen(list(run.command))
    try:
        # Between fork and exec the child still shows the parent's command line: wait for its own.
        cmdline = Path(f"/proc/{orphan.pid}/cmdline")
        for _ in range(500):
            if str(run.run_dir) in cmdline.read_bytes().decode(errors="replace"):
                break
            time.sleep(0.01)
        manifest.entry(run.name, {"state": "running", "launch": {"pid": orphan.pid}})
        runner = SweepRunner(plan, ProcessLauncher(), manifest)
        with pytest.raises(ConfigError, match=f"run {run.name} is still running"):
            runner.pending_runs(plan.runs)
    finally:
        orphan.kill()
        orphan.wait()
    assert runner.pending_runs(plan.runs) == [run]  # once it is gone, the run is launched again


def test_mechanism_presets_without_alpha_use_their_own_alpha_and_add_the_baseline():
    config = config_of("mechanisms=ar,lopti", "seeds=1")
    assert grid_alphas(config) == () and grid_presets(config) == ("baseline", "ar", "lopti")
    assert grid_alphas(config_of("seeds=1")) == (0.0, 0.5)  # no presets: the default alpha grid
    crossed = config_of("mechanisms=ar", "alpha=0.25", "add_baseline=false")
    assert grid_alphas(crossed) == (0.25,) and grid_presets(crossed) == ("ar",)


def test_default_sweep_is_two_alphas_by_eight_seeds_by_120_local_steps():
    config = config_of()
    assert grid_alphas(config) == (0.0, 0.5) and config.seeds == tuple(range(1, 9)) and run_steps(config) == 120
    assert config_of("steps=50").steps == 50
    assert config_of("extra=[trainer.total_steps=30]").steps is None  # the override decides, given once
    assert config_of("local.steps=null").steps is None  # the trainer's own 400
    # an experiment named in extra (EXTRA="experiment=X") or by experiment= keeps its own trainer.total_steps
    assert config_of("extra=[experiment=long_addition]").steps is None
    assert config_of("experiment=long_addition").steps is None
    assert config_of("experiment=long_addition", "steps=40").steps == 40
    assert config_of("backend=verl").steps is None  # verl keeps its experiment's steps


def test_every_backend_and_launcher_choice_has_a_registered_object():
    from sweeps.backends import backend_names, get_backend
    from sweeps.launchers import LAUNCHERS, build_launcher
    from sweeps.launchers.process import ProcessLauncher

    assert all(config_of(f"backend={name}").backend == name for name in backend_names())
    assert all(config_of(f"launcher={name}").launcher == name for name in LAUNCHERS.names())
    assert get_backend(config_of("backend=verl").backend).sets_threads is False
    assert get_backend(config_of().backend).sets_threads is True
    assert isinstance(build_launcher(config_of(), Path("."), "s", 1), ProcessLauncher)


def test_seeds_that_would_repeat_other_runs_are_refused():
    with pytest.raises(ConfigError, match=r"seeds = 2147483648 is not allowed: a seed is an integer in "
                                          r"\[0, 2147483646\].*repeat the runs of seed 1"):
        config_of("seeds=1,2147483648")
    assert config_of("seeds=0,2147483646").seeds == (0, 2147483646)


@pytest.mark.parametrize(("argv", "message"), [
    (["extra=[task=glob(*)]"], "extra = 'task=glob(*)' is not allowed: an axis lists its values"),
    (["extra=[trainer.lr=interval(0,1)]"], "extra = 'trainer.lr=interval(0,1)' is not allowed: an axis lists"),
    (["extra=[trainer.lr=range(1,1)]"], "extra = 'trainer.lr=range(1,1)' is not allowed: the axis trainer.lr has no "
                                        "values"),
    (["name=" + "a" * 300], "(300 characters) is not allowed: a sweep name has at most 128 characters"),
    (["extra=[trainer.lrr=1e-3]"], "trainer.lrr = '1e-3' is not allowed: trainer has no key 'lrr'; allowed keys of "
                                   "trainer: total_steps, prompts_per_step"),
    (["lrr=1"], "lrr = '1' is not allowed: the config has no key 'lrr'; allowed keys: name, root, experiment"),
])
def test_bad_grid_input_is_refused_before_anything_without_a_traceback(tmp_path, capsys, argv, message):
    from sweeps.cli import main

    assert main([f"root={tmp_path / 'runs'}", "alpha=0.5", "seeds=1", *argv]) == 2
    error = capsys.readouterr().err
    assert message in error and "+trainer.lrr" not in error and "+lrr" not in error
    assert not (tmp_path / "runs").exists()


def test_env_interpolations_are_refused_before_they_are_resolved_into_the_record(tmp_path, capsys, monkeypatch):
    from sweeps.cli import main

    monkeypatch.setenv("DATAFLEX_TEST_SECRET", "s3cret")
    assert main([f"root={tmp_path}", "backend=verl", "dry_run=true",
                 "extra=[verl.project=${oc.env:DATAFLEX_TEST_SECRET}]"]) == 2
    output = capsys.readouterr()
    assert "an ${oc.env:...} interpolation would be resolved into the recorded command lines" in output.err
    assert "s3cret" not in output.out + output.err
    experiment = tmp_path / "verl_secret.yaml"
    source = (REPO / "conf" / "verl_experiment" / "verl_kk_3b.yaml").read_text()
    experiment.write_text(source.replace("project: dataflex-rl", "project: ${oc.env:DATAFLEX_TEST_SECRET}"))
    assert main([f"root={tmp_path}", "backend=verl", "dry_run=true", f"verl.experiment={experiment}",
                 "extra=[verl.model=/m verl.data_dir=/d]"]) == 2
    output = capsys.readouterr()
    assert f"verl.experiment = '{experiment}' is not allowed: an ${{oc.env:...}}" in output.err
    assert "s3cret" not in output.out + output.err


def test_extra_is_read_once_per_sweep_and_the_runs_are_planned_from_typed_axes(tmp_path, monkeypatch):
    """Planning 8 runs reads no override text again: ``extra`` was read once, into the config's common overrides
    and typed axes, and each run's commands, warm starts and step count come from them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config = config_of("alpha=0.0,0.5", "seeds=1,2", "steps=3", "validate=false",
                       "extra=[trainer.lr=1e-4,3e-4 trainer.val_every=1]")
    assert [str(item) for item in common_overrides(config)] == ["trainer.val_every=1"]
    assert [(axis.name, axis.values) for axis in extra_axes(config)] == [("trainer.lr", ("0.0001", "0.0003"))]
    parsed = []
    original = OverridesParser.parse_override
    monkeypatch.setattr(OverridesParser, "parse_override",
                        lambda self, text: parsed.append(text) or original(self, text))
    specs = expand_grid(config)
    runs = get_backend(config.backend).plan(config, specs, "typed", tmp_path / "typed", threads=1)
    warm = get_backend(config.backend).warm_starts(config, specs, tmp_path / "typed", threads=1)
    assert parsed == []
    assert len(runs) == 8 and {run.total_steps for run in runs} == {3} and len(warm) == 2  # one per seed
    assert runs[-1].spec.factors == {"alpha": 0.5, "trainer.lr": "0.0003", "seed": 2}
    assert runs[-1].command[-10:-5] == ("++dataflex.actuator.params.alpha=0.5", "trainer.lr=0.0003", "seed=2",
                                        "sft.seed=2", "axes=[dataflex.actuator.params.alpha,trainer.lr,seed]")


def test_planning_composes_once_per_set_of_group_choices_not_once_per_run(tmp_path, monkeypatch):
    """python -m sweeps seeds=1,2,...,1000 dry_run=true (silent after 120 s at about 1 GB: one Hydra composition
    of conf/train.yaml per run and per warm start)"""
    from hydra._internal.hydra import Hydra

    from dataflex_rl.compose import compose_train_config

    composed: list[list[str]] = []
    original = Hydra.compose_config
    monkeypatch.setattr(Hydra, "compose_config", lambda self, config_name, overrides, *args, **kwargs: (
        config_name == "train" and composed.append(list(overrides))
        or original(self, config_name, overrides, *args, **kwargs)))

    def plan(seeds: str, *argv: str):
        composed.clear()
        config = config_of("alpha=0.0,0.5", f"seeds={seeds}", "steps=3", *argv,
                           f"extra=[sft.steps=2 sft.cache_dir={tmp_path / 'sft'}]")
        specs = expand_grid(config)
        runs = get_backend(config.backend).plan(config, specs, "many", tmp_path / "many", threads=1)
        warm = get_backend(config.backend).warm_starts(config, specs, tmp_path / "many", threads=1)
        return runs, warm, len(composed)

    few_runs, few_warm, few = plan("1,2")
    many_runs, many_warm, many = plan("1,2,3,4,5,6")
    assert (len(few_runs), len(few_warm), len(many_runs), len(many_warm)) == (4, 2, 12, 6)
    assert few == many == 2  # the runs' config groups, the warm starts'; not one per run
    # each run's config is what Hydra composes from its overrides alone
    for run in (many_runs[0], many_runs[-1], many_warm[-1]):
        assert run.config == compose_train_config(run.overrides)
    assert many_runs[-1].config["seed"] == 6 and many_runs[-1].config["sft"]["seed"] == 6
    # a group axis (the preset) composes once per choice
    runs, _, count = plan("1,2,3", "mechanisms=ar,lopti")
    assert len(runs) == 18 and count == 3 + 1  # baseline, ar, lopti (x 2 alphas x 3 seeds); the warm starts'
    assert {run.config["dataflex"]["actuator"]["name"] for run in runs} == {
        compose_train_config([f"dataflex={preset}"])["dataflex"]["actuator"]["name"]
        for preset in ("baseline", "ar", "lopti")}
