"""Every verl V1 trainer mode with the mechanism: registration, the shared advantage step, the trainer-mode key of the
command builder and the doctor, and the doctor on a verl without the pieces the plugin builds on."""

from __future__ import annotations

import sys

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from dataflex_rl import ConfigError
from dataflex_rl.verl import VERL_VERSION, check
from dataflex_rl.verl.command import build_verl_command, experiment_environment, resolve_experiment, verl_overrides_of
from dataflex_rl.verl.config import (
    DEFAULT_TRAINER_MODE,
    LOSS_MODE,
    LOSS_MODE_KEY,
    TRAINER_MODE_KEY,
    TRAINER_MODES,
    mechanism_from_verl_config,
    validate_overrides,
)
from dataflex_rl.verl.trainer import TRAINERS, DataflexSyncTrainer

from test_verl_plugin import run_python  # noqa: E402  (sibling module; tests/verl is on sys.path)
from test_verl_trainer import dataflex_block, fill_queue, padded, random_rows, set_dataflex

VERL_BASES = {"sync": PPOTrainerSync, "colocate_async": PPOTrainerColocateAsync,
              "separate_async": PPOTrainerSeparateAsync}
CPU = ["prepared=/tmp/prepared"]


@pytest.mark.slow
def test_every_mode_is_registered_in_a_fresh_process(tmp_path):
    # As verl's main_ppo resolves it: only verl is imported; its __init__ loads the entry point.
    code = (
        "from verl.trainer.ppo.v1.trainer_base import get_trainer_cls\n"
        f"for name in {list(TRAINER_MODES)!r}:\n"
        "    cls = get_trainer_cls(name)\n"
        "    print(name, cls.__module__, cls.verl_mode, cls.__mro__[2].__name__)\n"
    )
    result = run_python(code, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()[-len(TRAINER_MODES):]
    assert lines == [f"{name} dataflex_rl.verl.trainer {mode} {VERL_BASES[mode].__name__}"
                     for name, mode in TRAINER_MODES.items()]


@pytest.mark.parametrize("name", list(TRAINER_MODES))
def test_each_trainer_answers_its_verl_mode(name):
    cls = TRAINERS[name]
    assert issubclass(cls, VERL_BASES[TRAINER_MODES[name]])
    trainer = object.__new__(cls)
    trainer.trainer_mode = name  # what verl's base __init__ does with trainer.v1.trainer_mode
    assert trainer.trainer_mode == TRAINER_MODES[name]


def advantages_of(cls, config, rows, queues, global_steps: int = 3):
    """The advantages ``cls._compute_advantage`` writes for ``rows`` on a fresh queue (no workers: a stub)."""
    queue = queues.new()
    batch = fill_queue(queue, rows, with_rollout_log_probs=True)
    trainer = object.__new__(cls)
    trainer.config = config
    if hasattr(cls, "verl_mode"):
        trainer.mechanism = mechanism_from_verl_config(config)
        trainer.histogram_logger = None
        trainer.global_steps = global_steps
        trainer.timing_raw = {}
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics=metrics)
    return padded(queue, batch, "advantages"), metrics


@pytest.mark.parametrize("name", ["dataflex_colocate_async", "dataflex_separate_async"])
def test_the_shared_advantage_step_gives_dataflex_syncs_advantages(verl_config, queues, name):
    verl_config.actor_rollout_ref.rollout.n = 4
    verl_config.algorithm.rollout_correction.rollout_is = "token"
    rows = random_rows(seed=7, prompts=3, group=4)
    set_dataflex(verl_config, dataflex_block(alpha=0.6))
    expected, expected_metrics = advantages_of(DataflexSyncTrainer, verl_config, rows, queues)
    found, metrics = advantages_of(TRAINERS[name], verl_config, rows, queues)
    assert torch.equal(found, expected)
    assert metrics == expected_metrics and metrics["dataflex/weight/std"] > 0
    # alpha 0: exactly the advantages verl's own trainer of the same mode writes.
    set_dataflex(verl_config, dataflex_block(alpha=0.0))
    baseline, _ = advantages_of(TRAINERS[name], verl_config, rows, queues)
    verl_own, _ = advantages_of(VERL_BASES[TRAINER_MODES[name]], verl_config, rows, queues)
    assert torch.equal(baseline, verl_own) and not torch.equal(baseline, found)


@pytest.mark.parametrize("name", list(TRAINER_MODES))
def test_the_command_builder_takes_the_trainer_mode_variable(name):
    command = build_verl_command("verl_cpu_tiny", (), [*CPU, f"trainer_mode={name}"])
    overrides = verl_overrides_of(command)
    assert overrides[0] == f"{TRAINER_MODE_KEY}={name}"
    separate = "actor_rollout_ref.rollout.checkpoint_engine.backend=dataflex_cpu" in overrides
    assert separate == (name == "dataflex_separate_async")  # the experiment's trainer_modes block
    config, mechanism, _ = validate_overrides(overrides, experiment_environment("verl_cpu_tiny"))
    assert config.trainer.v1.trainer_mode == name and mechanism.config.mechanism == "reweight"


def test_the_default_mode_is_dataflex_sync():
    assert verl_overrides_of(build_verl_command("verl_cpu_tiny", (), CPU))[0] == \
        f"{TRAINER_MODE_KEY}={DEFAULT_TRAINER_MODE}"


def test_an_unknown_trainer_mode_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match=r"verl\.trainer_mode = 'async' is not allowed: the dataflex trainers are "
                                          r"\['dataflex_sync', 'dataflex_colocate_async', 'dataflex_separate_async'\]"):
        build_verl_command("verl_cpu_tiny", (), [*CPU, "trainer_mode=async"])


def test_the_experiments_mode_block_is_checked(tmp_path):
    experiment = OmegaConf.load(resolve_experiment("verl_cpu_tiny"))
    experiment.trainer_modes = {"dataflex_fully_async": ["trainer.nnodes=1"]}
    path = tmp_path / "verl_bad.yaml"
    OmegaConf.save(experiment, path)
    with pytest.raises(ConfigError, match=r"trainer_modes\.dataflex_fully_async = 'dataflex_fully_async' is not allowed"):
        build_verl_command(path, (), CPU)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["trainer.v1.trainer_mode=colocate_async"],
         r"trainer\.v1\.trainer_mode = 'colocate_async' is not allowed: the dataflex trainers are"),
        (["trainer_mode=dataflex_separate_async", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
         r"checkpoint_engine\.backend = 'nccl' is not allowed with trainer\.v1\.trainer_mode=dataflex_separate_async "
         r"in verl's CPU mode"),
    ],
    ids=["verl-own-mode", "separate-async-without-the-cpu-checkpoint-engine"],
)
def test_the_doctor_refuses_a_mode_it_cannot_run(extra, message):
    command = build_verl_command("verl_cpu_tiny", (), [*CPU, *extra])
    with pytest.raises(ConfigError, match=message):
        validate_overrides(verl_overrides_of(command), experiment_environment("verl_cpu_tiny"))


def test_the_doctor_lists_verls_trainer_modes_and_its_pieces(capsys):
    report = check.Report()
    assert check.check_verl_pieces(report) == {"policy_loss", "trainer"}
    output = capsys.readouterr().out
    assert report.failures == [], output
    assert "ok    verl trainer modes: colocate_async, separate_async, sync; dataflex: dataflex_sync" in output
    for pieces in check.VERL_PIECES.values():
        for what, _, _ in pieces:
            assert f"ok    verl: {what}" in output
    assert "ok    route: the policy-loss route (actor_rollout_ref.actor.policy_loss.loss_mode=dataflex)" in output
    assert "ok    route: the dataflex trainer modes (trainer.v1.trainer_mode=dataflex_sync|" in output


def test_the_doctor_names_what_a_verl_without_the_v1_registry_lacks(monkeypatch, capsys):
    # A verl whose V1 trainers are gone (its neo branch removes them): the module does not import, the route stays.
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.v1.trainer_base", None)
    report = check.Report()
    assert check.check_verl_pieces(report) == {"policy_loss"}
    output = capsys.readouterr().out
    assert "no    verl: V1 trainer registry: verl.trainer.ppo.v1.trainer_base.register_trainer is missing" in output
    assert "ok    verl: TransferQueue" in output
    assert (f"no    route: the dataflex trainer modes (trainer.v1.trainer_mode=dataflex_sync|dataflex_colocate_async|"
            f"dataflex_separate_async): not supported by this verl (install verl=={VERL_VERSION} and TransferQueue)"
            in output)
    assert "ok    route: the policy-loss route" in output
    assert report.failures == []


def test_the_doctor_names_a_missing_set_loss_fn(monkeypatch, capsys):
    from verl.workers import engine_workers

    monkeypatch.delattr(engine_workers.ActorRolloutRefWorker, "set_loss_fn")
    report = check.Report()
    assert check.check_verl_pieces(report) == {"policy_loss"}
    assert report.failures == []
    assert "no    verl: set_loss_fn of the actor workers: verl.workers.engine_workers.ActorRolloutRefWorker" \
           ".set_loss_fn is missing" in capsys.readouterr().out


def test_the_doctor_main_stops_before_the_plugin_when_verl_lacks_the_policy_loss_registry(monkeypatch, capsys):
    from verl.trainer.ppo import core_algos

    monkeypatch.delattr(core_algos, "get_policy_loss_fn")
    monkeypatch.setattr(check, "check_plugin_import", lambda report: pytest.fail("the plugin import ran"))
    assert check.main([]) == 1
    assert "FAIL  verl: policy-loss lookup" in capsys.readouterr().out


def test_a_trainer_mode_command_fails_on_a_verl_without_the_modes(capsys):
    report = check.Report()
    check.check_command(report, ["verl_cpu_tiny", *CPU], routes={"policy_loss"})
    assert report.failures == ["route"]
    assert "the dataflex trainer modes (trainer.v1.trainer_mode=" in capsys.readouterr().out


@pytest.mark.slow  # a fresh process, as test_every_mode_is_registered_in_a_fresh_process
def test_the_doctor_resolves_every_mode_through_the_entry_point(capsys):
    report = check.Report()
    check.check_entry_point(report, {"policy_loss", "trainer"})
    output = capsys.readouterr().out
    assert report.failures == [], output
    assert f"ok    verl resolves {LOSS_MODE_KEY}={LOSS_MODE}, {', '.join(TRAINER_MODES)}" in output
