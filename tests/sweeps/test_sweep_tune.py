"""The Optuna driver with the scripted trainer (``val/accuracy = alpha + 0.01 * seed`` at every step): the
objective, pruning on intermediate values, resume from the sqlite study, recovery of a trial left running."""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from dataflex_rl.validation import ConfigError
from sweeps.cli import load_config
from sweeps.sweep_config import run_steps
from sweeps.tune import TUNE_KEYS, main, parse_tune_config

from .conftest import SCRIPTED_TRAIN, runs_by_name


def tune_argv(tmp_path, *more: str) -> list[str]:
    return ["name=study", f"root={tmp_path / 'runs'}", "seeds=1,2", "steps=3", "jobs=2",
            "search=[{name: alpha, type: float, low: 0.0, high: 1.0}]", "enqueue=[{alpha: 0.9}, {alpha: 0.1}]",
            "pruner.n_startup_trials=1", f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "poll_s=0.05",
            *more]


def load_study(tmp_path) -> optuna.Study:
    return optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path / 'runs' / 'study' / 'optuna.db'}")


def test_study_prunes_a_worse_trial_then_resumes_from_its_sqlite_file(tmp_path, repo_on_path, monkeypatch, capsys):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.5")
    assert main(tune_argv(tmp_path, "n_trials=2")) == 0
    study = load_study(tmp_path)
    first, second = study.trials
    # Trial 0: alpha 0.9, seeds 1 and 2: mean of 0.91 and 0.92.
    assert first.state == TrialState.COMPLETE and first.value == pytest.approx(0.915)
    assert first.intermediate_values == pytest.approx({1: 0.915, 2: 0.915, 3: 0.915})
    # Trial 1: alpha 0.1 reports 0.115 at step 1, below the median of trial 0 (0.915): pruned there.
    assert second.state == TrialState.PRUNED and second.params == {"alpha": 0.1}
    assert min(second.intermediate_values) == 1 and second.intermediate_values[1] == pytest.approx(0.115)
    sweep_dir = tmp_path / "runs" / "study"
    runs = runs_by_name(sweep_dir)
    assert {runs[name]["state"] for name in ("t000-s1", "t000-s2")} == {"completed"}
    assert {runs[name]["state"] for name in ("t001-s1", "t001-s2")} == {"interrupted"}
    steps_logged = len((sweep_dir / "t001-s1" / "metrics.jsonl").read_text().splitlines())
    assert steps_logged < 3  # stopped before the end
    output = capsys.readouterr().out
    assert "best trial 0" in output and "optuna-dashboard sqlite:///" in output

    # The same command with n_trials=3 runs one more trial and leaves the first two alone.
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0")
    assert main(tune_argv(tmp_path, "n_trials=3")) == 0
    study = load_study(tmp_path)
    assert len(study.trials) == 3 and study.trials[2].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert study.trials[0].value == pytest.approx(0.915)
    runs = runs_by_name(sweep_dir)
    assert [runs[name]["attempts"] for name in ("t000-s1", "t000-s2", "t001-s1", "t001-s2")] == [1, 1, 1, 1]
    assert runs["t002-s1"]["attempts"] == 1
    # A finished study: the same command again starts nothing.
    assert main(tune_argv(tmp_path, "n_trials=3")) == 0
    assert len(load_study(tmp_path).trials) == 3


def test_a_trial_left_running_by_a_dead_driver_is_retried_with_its_parameters(tmp_path, repo_on_path):
    sweep_dir = tmp_path / "runs" / "study"
    sweep_dir.mkdir(parents=True)
    study = optuna.create_study(study_name="study", storage=f"sqlite:///{sweep_dir / 'optuna.db'}",
                                direction="maximize")
    orphan = study.ask({"alpha": optuna.distributions.FloatDistribution(0.0, 1.0)})
    assert orphan.params == {"alpha": orphan.params["alpha"]}  # RUNNING, as a SIGKILLed driver leaves it
    assert main(tune_argv(tmp_path, "n_trials=1", "enqueue=[]")) == 0
    trials = load_study(tmp_path).trials
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials[1]
    assert retry.user_attrs["retry_of"] == 0 and retry.params == orphan.params
    # Its runs are named after the original trial, so a retry resumes the original run folders.
    assert retry.user_attrs["runs"] == ["t000-s1", "t000-s2"]
    expected = orphan.params["alpha"] + 0.015
    assert retry.value == pytest.approx(expected)
    assert json.loads((sweep_dir / "t000-s2" / "status.json").read_text())["state"] == "completed"


def test_a_failing_run_fails_its_trial_and_the_driver_exit_status(tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_FAIL", "t000-s2")
    assert main(tune_argv(tmp_path, "n_trials=1", "retries=0", "enqueue=[{alpha: 0.5}]")) == 1
    assert [trial.state for trial in load_study(tmp_path).trials] == [TrialState.FAIL]


def test_a_trial_run_still_alive_from_a_dead_driver_refuses_the_study(tmp_path, repo_on_path, monkeypatch, capsys):
    from sweeps import runner as runner_module

    def still_alive(self, runs):
        raise ConfigError(f"run {runs[0].name} is still running from an earlier invocation (pid 4242)")

    monkeypatch.setattr(runner_module.SweepRunner, "pending_runs", still_alive)
    assert main(tune_argv(tmp_path, "n_trials=1", "enqueue=[{alpha: 0.5}]")) == 2  # refused, not a traceback
    assert "run t000-s1 is still running from an earlier invocation" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(tune_argv(tmp_path, "n_trials=1", "enqueue=[{alpha: 0.5}]")) == 0  # lock released: it resumes


@pytest.mark.parametrize(("argv", "named"), [
    (["search=[]"], "search = []"),
    (["search=[{name: alpha, type: float, low: 1.0, high: 0.5}]"], "search.alpha.low = 1.0"),
    (["search=[{name: alpha, type: beta, low: 0.0, high: 1.0}]"], "search.alpha.type = 'beta'"),
    (["enqueue=[{lr: 0.1}]"], "'lr' is not searched"),
    (["alpha=0.5"], "alpha/mechanisms/eta grids are not allowed"),
    (["pruner.name=hyperband"], "pruner.name = 'hyperband'"),
    (["n_trials=0"], "n_trials = 0"),
])
def test_bad_study_settings_are_refused_naming_them(argv, named):
    with pytest.raises(ConfigError) as caught:
        parse_tune_config(load_config(argv, config_name="optuna", allowed_extra_keys=TUNE_KEYS)[0])
    assert named in str(caught.value)


def test_the_default_study_searches_alpha_and_starts_at_the_baseline():
    tune = parse_tune_config(load_config([], config_name="optuna", allowed_extra_keys=TUNE_KEYS)[0])
    assert [param.name for param in tune.search] == ["alpha"]
    assert tune.enqueue[0]["alpha"] == 0.0 and tune.sweep.alpha == () and tune.direction == "maximize"


def test_default_study_searches_alpha_only_and_lr_is_an_opt_in() -> None:
    cfg, _ = load_config([], config_name="optuna", allowed_extra_keys=TUNE_KEYS)
    tune = parse_tune_config(cfg)
    assert [param.name for param in tune.search] == ["alpha"] and tune.sweep.seeds == (1, 2)
    assert run_steps(tune.sweep) == 120 and tune.final_window == 5 and tune.n_trials == 8
    cfg, _ = load_config(["tune_lr=true"], config_name="optuna", allowed_extra_keys=TUNE_KEYS)
    with_lr = parse_tune_config(cfg)
    assert [param.name for param in with_lr.search] == ["alpha", "trainer.lr"]
    assert all(item["trainer.lr"] == 1.0e-4 for item in with_lr.enqueue)


def test_dry_run_prints_commands_and_an_estimate_and_starts_nothing(tmp_path, capsys) -> None:
    assert main(["name=dry", f"root={tmp_path / 'runs'}", "dry_run=true"]) == 0
    output = capsys.readouterr().out
    assert "estimate: about" in output and "8 trial(s) x 2 seed(s) x 120 steps" in output
    assert "trainer.total_steps=120" in output and not (tmp_path / "runs").exists()


def test_objective_is_the_final_window_mean(tmp_path) -> None:
    from tests.analysis.synthetic import write_fake_run
    from sweeps.tune import final_window_mean

    run = write_fake_run(tmp_path / "run", metrics={"val/accuracy": [0.1, 0.9, 0.2, 0.3, 0.4, 0.5, 0.6]},
                         steps=[0, 1, 2, 3, 4, 5, 6])
    assert final_window_mean(run, "val/accuracy", 5) == pytest.approx((0.2 + 0.3 + 0.4 + 0.5 + 0.6) / 5)
    assert final_window_mean(run, "val/accuracy", 1) == pytest.approx(0.6)
    assert final_window_mean(run, "not/logged", 5) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["search=[{name: alpha, type: float, low: 0.0, high: 2.0}]"],
     "search.alpha.high: run t000-s1: dataflex.actuator.params.alpha = 2.0 is not allowed"),
    (["enqueue=[{alpha: 1.5}]"], "enqueue[0] = {'alpha': 1.5}: run t000-s1: dataflex.actuator.params.alpha = 1.5"),
    (["metric=val/acc"], "metric = 'val/acc' is not allowed: not a metric the trainer logs (did you mean "
                         "val/accuracy?)"),
])
def test_every_searched_value_and_the_metric_are_checked_before_the_dry_run(tmp_path, capsys, argv, message):
    assert main([f"root={tmp_path}", "dry_run=true", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_misspelt_plan_metric_is_refused_before_the_pilot(tmp_path, capsys):
    from sweeps.cli import main as sweep_main

    assert sweep_main([f"root={tmp_path}", "target_mde=0.01", "seeds=1,2", "plan_metric=val/acc"]) == 2
    assert "plan_metric = 'val/acc' is not allowed: not a metric the trainer logs" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
