"""``python -m dataflex_rl.verl.check``: the doctor shows import tracebacks, versions, the routes this verl supports,
the entry point, and validates a command's route and dataflex block."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dataflex_rl.verl import check

MODEL, DATA = "model=/models/Qwen2.5-3B-Instruct", "data_dir=/data/kk"


def test_a_plugin_that_fails_to_import_shows_its_traceback(tmp_path, monkeypatch, capsys):
    # The failure verl would log at DEBUG level only (verl/__init__.py), leaving "Unknown trainer 'dataflex_sync'".
    (tmp_path / "broken_plugin.py").write_text("import vllm_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(check, "PLUGIN_MODULE", "broken_plugin")
    report = check.Report()
    assert check.check_plugin_import(report) is False
    output = capsys.readouterr().out
    assert "FAIL  import broken_plugin" in output
    assert "Traceback" in output and "ModuleNotFoundError: No module named 'vllm_that_is_not_installed'" in output
    assert report.failures == ["import broken_plugin"]


def test_versions_name_each_package_and_flag_a_missing_required_one(monkeypatch, capsys):
    report = check.Report()
    check.check_versions(report)
    output = capsys.readouterr().out
    for label in ("verl", "torch", "transformers", "vllm", "transfer_queue"):
        assert f"{label} version" in output
    assert report.failures == []  # this environment has verl 0.9.1 and what it needs
    monkeypatch.setattr(check, "distribution_version", lambda name: None if name == "cachetools" else "0.9.1")
    check.check_versions(report)
    assert "FAIL  cachetools installed: not found" in capsys.readouterr().out


def test_a_valid_experiment_command_passes(capsys):
    report = check.Report()
    check.check_command(report, ["verl_kk_3b", MODEL, DATA, "dataflex.mechanism=isolate",
                                 "dataflex.actuator.name=lopti", "dataflex.actuator.params.split=quantile"])
    output = capsys.readouterr().out
    assert report.failures == [], output
    assert "ok    verl config composes" in output
    assert "mechanism=isolate (staged" in output and "split=quantile" in output
    assert "ok    run store: none" in output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["dataflex.actuator.params.alpha=1.5"], "dataflex.actuator.params.alpha = 1.5 is not allowed"),
        (["dataflex.mechanism=isolate", "dataflex.actuator.name=lopti",
          "actor_rollout_ref.actor.optim.warmup_style=cosine"],
         "actor_rollout_ref.actor.optim.warmup_style = 'cosine' is not allowed"),
        (["+dataflex_run.dir=/runs/s/r", "+dataflex_run.colour=red"], "dataflex_run: unknown key(s) 'colour'"),
        (["actor_rollout_ref.actor.no_such_key=1"], "verl config composes"),
    ],
    ids=["bad-alpha", "warmup-style-under-lopti", "bad-run-block", "bad-verl-override"],
)
def test_a_bad_command_fails_naming_the_key(capsys, arguments, message):
    report = check.Report()
    check.check_command(report, ["verl_kk_3b", MODEL, DATA, *arguments])
    output = capsys.readouterr().out
    assert len(report.failures) == 1 and message in output, output


def test_raw_verl_overrides_after_a_double_dash(capsys):
    report = check.Report()
    check.check_command(report, ["--", "trainer.v1.trainer_mode=sync", "+dataflex.mechanism=reweight"])
    output = capsys.readouterr().out
    assert report.failures == ["route"]
    assert "trainer.v1.trainer_mode = 'sync' is not allowed: the dataflex trainers are ['dataflex_sync'," in output
    assert "or keep verl's trainer and add the policy-loss route: actor_rollout_ref.actor.policy_loss." in output


def test_a_policy_loss_route_command_passes_naming_the_route_and_the_trainer(capsys):
    report = check.Report()
    check.check_command(report, ["verl_kk_3b", MODEL, DATA, "trainer_mode=v0"])
    output = capsys.readouterr().out
    assert report.failures == [], output
    assert ("ok    route: the policy-loss route (actor_rollout_ref.actor.policy_loss.loss_mode=dataflex) in verl's "
            "V0 trainer (trainer.use_v1=false)") in output


@pytest.mark.slow  # two fresh processes importing verl: 20-40 s on a shared 2-core machine
def test_the_doctor_passes_in_this_environment(tmp_path):
    # Versions, the import, the entry point in a fresh process (as verl's main_ppo resolves it) and a command.
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "dataflex_rl.verl.check", "verl_kk_3b", MODEL, DATA],
        capture_output=True, text=True, check=False, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ("ok    verl resolves actor_rollout_ref.actor.policy_loss.loss_mode=dataflex, dataflex_sync, "
            "dataflex_colocate_async, dataflex_separate_async: (fresh process, entry point only)") in result.stdout
    assert "ok    route: the policy-loss route" in result.stdout
    assert "ok    verl trainer modes: colocate_async, separate_async, sync;" in result.stdout
    assert result.stdout.rstrip().endswith("all checks passed")
