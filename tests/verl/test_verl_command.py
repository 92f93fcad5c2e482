"""The verl command line of an experiment: contents, composition with verl's own config, validation, errors."""

from __future__ import annotations

import shlex
import sys

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from dataflex_rl import ConfigError, build_mechanism
from dataflex_rl.overrides import hydra_value
from dataflex_rl.verl.command import EXPERIMENT_DIR, build_verl_command, dataflex_arguments, main, wandb_environment
from dataflex_rl.verl.config import DEFAULT_TRAINER_MODE, TRAINER_MODE_KEY

VARIABLES = ["model=/models/qwen", "data_dir=/data/kk"]


def as_dict(arguments: list[str]) -> dict[str, str]:
    """``key=value`` arguments as a dict (the last value of a key wins, as in Hydra)."""
    return dict(argument.split("=", 1) for argument in arguments)


def test_command_starts_verl_with_the_dataflex_trainer():
    command = build_verl_command("verl_kk_3b", [], VARIABLES)
    assert command[:4] == [sys.executable, "-m", "verl.trainer.main_ppo", f"{TRAINER_MODE_KEY}={DEFAULT_TRAINER_MODE}"]
    arguments = as_dict(command[3:])
    # The paper's K&K setup.
    assert arguments["actor_rollout_ref.model.path"] == "/models/qwen"
    assert arguments["actor_rollout_ref.rollout.n"] == "8"
    assert arguments["actor_rollout_ref.actor.optim.lr"] == "1e-6"
    assert arguments["actor_rollout_ref.rollout.temperature"] == "0.7"
    assert arguments["actor_rollout_ref.actor.clip_ratio_low"] == "0.2"
    assert arguments["actor_rollout_ref.actor.clip_ratio_high"] == "0.24"
    assert arguments["actor_rollout_ref.actor.use_kl_loss"] == "true"
    assert arguments["actor_rollout_ref.actor.kl_loss_coef"] == "0.001"
    assert arguments["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert arguments["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert arguments["algorithm.adv_estimator"] == "grpo"
    assert arguments["data.train_files"] == "/data/kk/train.parquet"
    assert arguments["reward.custom_reward_function.path"] == "pkg://dataflex_rl.verl.reward"
    assert arguments["reward.custom_reward_function.name"] == "compute_score"
    # The full, validated dataflex block.
    assert arguments["+dataflex.mechanism"] == "reweight"
    assert arguments["+dataflex.actuator.params.alpha"] == "0.2"
    assert arguments["+dataflex.actuator.params.normalize"] == "mean"
    assert arguments["+dataflex.warmup_step"] == "0"


def test_dataflex_overrides_and_extra_verl_overrides_win():
    command = build_verl_command(
        "verl_kk_3b",
        ["dataflex.actuator.params.alpha=0.0", "+dataflex.warmup_step=5"],
        [*VARIABLES, "seed=7", "trainer.total_epochs=1", "dataflex.actuator.params.normalize=none"],
    )
    arguments = as_dict(command[3:])
    assert arguments["+dataflex.actuator.params.alpha"] == "0.0"
    assert arguments["+dataflex.warmup_step"] == "5"
    assert arguments["+dataflex.actuator.params.normalize"] == "none"
    assert arguments["data.seed"] == arguments["actor_rollout_ref.rollout.seed"] == "7"
    assert command[-1] == "trainer.total_epochs=1"  # after the experiment's trainer.total_epochs=5
    assert sum(argument.startswith("+dataflex.warmup_step=") for argument in command) == 1


def test_command_composes_with_verls_config_and_passes_its_validation(compose_verl):
    command = build_verl_command("verl_kk_3b", ["dataflex.actuator.params.alpha=0.5"], VARIABLES)
    config = compose_verl(command[3:])
    OmegaConf.resolve(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    assert config.trainer.v1.trainer_mode == "dataflex_sync"
    assert config.actor_rollout_ref.rollout.n == 8
    assert config.actor_rollout_ref.actor.clip_ratio_high == 0.24
    assert config.trainer.logger == ["console", "wandb"]
    assert need_reference_policy(config)  # the KL loss needs the reference policy
    mechanism = build_mechanism(config.dataflex)
    assert mechanism.config.actuator.params == {"alpha": 0.5, "normalize": "mean", "tau": None, "neg_adv_weight": 1.0}


def test_seed_command_of_the_brief_composes(compose_verl, kk_overrides):
    """The hand-written form ``+dataflex.mechanism=reweight ...`` composes into the same block."""
    overrides = [argument for argument in kk_overrides() if not argument.startswith("+dataflex.")]
    config = compose_verl(
        [
            *overrides,
            "+dataflex.mechanism=reweight",
            "+dataflex.scorer.name=token_prob",
            "+dataflex.actuator.name=advantage_reweight",
            "+dataflex.actuator.params.alpha=0.5",
        ]
    )
    assert build_mechanism(config.dataflex).config.actuator.params["alpha"] == 0.5


def test_bad_dataflex_value_is_refused_with_the_local_backends_message():
    with pytest.raises(ConfigError) as local_error:
        build_mechanism({"mechanism": "reweight", "actuator": {"name": "advantage_reweight", "params": {"alpha": 2}}})
    with pytest.raises(ConfigError) as command_error:
        build_verl_command("verl_kk_3b", ["dataflex.actuator.params.alpha=2"], VARIABLES)
    assert str(command_error.value) == str(local_error.value)
    assert "dataflex.actuator.params.alpha" in str(command_error.value)


def test_missing_variable_and_unknown_experiment_are_named():
    with pytest.raises(ConfigError, match=r"verl\.model: missing; pass model=VALUE"):
        build_verl_command("verl_kk_3b", [], ["data_dir=/data/kk"])
    with pytest.raises(ConfigError, match=r"experiment = 'verl_nope'.*verl experiments: .*verl_kk_3b"):
        build_verl_command("verl_nope", [], VARIABLES)
    with pytest.raises(ConfigError, match=r"dataflex override 'dataflex\.actuator' is not allowed"):
        build_verl_command("verl_kk_3b", ["dataflex.actuator"], VARIABLES)


@pytest.mark.parametrize("text", [b"backend: verl\nverl:\n  overrides: [a\n  b: : c\n", b"backend: verl\nx: \xff\n"],
                         ids=["not-yaml", "not-utf8"])
def test_an_experiment_file_that_does_not_parse_is_named_before_anything_starts(tmp_path, text, capsys):
    from sweeps.cli import main as sweep_main

    path = tmp_path / "verl_broken.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=rf"{path}: not a valid verl experiment file: \w+Error: "):
        build_verl_command(path, [], VARIABLES)
    assert sweep_main(["backend=verl", f"verl.experiment={path}", "alpha=0.5", "seeds=1", "dry_run=true",
                       f"root={tmp_path / 'runs'}", "name=broken"]) == 2
    assert f"nothing was started: {path}: not a valid verl experiment file" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_experiment_file_by_path_and_by_name_agree():
    assert build_verl_command(EXPERIMENT_DIR / "verl_kk_3b.yaml", [], VARIABLES) == build_verl_command(
        "verl_kk_3b", [], VARIABLES
    )


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (True, "true"),
        (None, "null"),
        (0.5, "0.5"),
        (3, "3"),
        ("token_prob", "token_prob"),
        ("pkg.module:Scorer", "'pkg.module:Scorer'"),
        ("true", "'true'"),
        ("it's", "'it\\'s'"),
        ([0.25, 0.5], "[0.25,0.5]"),
        ({}, "{}"),
    ],
)
def test_hydra_values(value, written):
    assert hydra_value(value) == written


def test_dataflex_arguments_flatten_every_leaf():
    block = {"mechanism": "reweight", "scorer": {"name": "token_prob", "params": {}}, "warmup_step": 2}
    assert dataflex_arguments(block) == [
        "+dataflex.mechanism=reweight",
        "+dataflex.scorer.name=token_prob",
        "+dataflex.scorer.params={}",
        "+dataflex.warmup_step=2",
    ]


def test_wandb_environment():
    assert wandb_environment("sweep-1", ["reweight", "verl"]) == {
        "WANDB_RUN_GROUP": "sweep-1",
        "WANDB_TAGS": "reweight,verl",
    }


def test_cli_prints_the_command(capsys):
    assert main(["verl_kk_3b", *VARIABLES, "dataflex.actuator.params.alpha=0.5"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed == build_verl_command("verl_kk_3b", ["dataflex.actuator.params.alpha=0.5"], VARIABLES)


def test_cli_reports_a_bad_value(capsys):
    assert main(["verl_kk_3b", *VARIABLES, "dataflex.warmup_step=-1"]) == 2
    assert "dataflex.warmup_step = -1 is not allowed" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["actor_rollout_ref.actor.optim.warmup_style=cosine",
                                      "actor_rollout_ref.actor.optim.lr_warmup_steps=10"])
def test_cli_refuses_what_the_trainer_refuses_before_printing(schedule, capsys):
    code = main(["verl_kk_3b", *VARIABLES, "dataflex.mechanism=isolate", "dataflex.actuator.name=lopti", schedule])
    captured = capsys.readouterr()
    assert code == 2
    assert f"{schedule.split('=')[0]} = " in captured.err and "is not allowed" in captured.err
    assert "verl.trainer.main_ppo" not in captured.out  # nothing printed to run


def test_cli_prints_the_cpu_mode_environment_before_the_command(capsys):
    assert main(["verl_cpu_tiny", "prepared=/tmp/prepared", "dataflex.actuator.params.alpha=0.5"]) == 0
    printed = shlex.split(capsys.readouterr().out)
    assert printed[:3] == ["VERL_PLATFORM=cpu", "VERL_USE_EXTERNAL_MODULES=dataflex_rl.verl.cpu.plugin",
                           "RAY_prestart_worker_first_driver=0"]
    assert "actor_rollout_ref.rollout.name=dataflex_cpu" in printed


def test_cli_refuses_a_gpu_rollout_in_cpu_mode(capsys):
    assert main(["verl_cpu_tiny", "prepared=/tmp/prepared", "actor_rollout_ref.rollout.name=vllm"]) == 2
    assert "actor_rollout_ref.rollout.name = 'vllm' is not allowed in verl's CPU mode" in capsys.readouterr().err


def test_an_unknown_platform_is_refused(tmp_path):
    experiment = OmegaConf.load(EXPERIMENT_DIR / "verl_cpu_tiny.yaml")
    experiment.platform = "tpu"
    path = tmp_path / "verl_tpu.yaml"
    OmegaConf.save(experiment, path)
    with pytest.raises(ConfigError, match=r"platform = 'tpu' is not allowed: one of \[None, 'cpu'\]"):
        build_verl_command(path, [], ["prepared=/tmp/prepared"])


def test_switching_actuator_keeps_only_the_parameters_the_new_one_has():
    # The experiment's block is AR (alpha 0.5, normalize mean). STAPO has neither parameter; the sigmoid weights
    # share normalize; Lopti's parameters are AR's plus two, so alpha stays (AR + Lopti).
    from dataflex_rl.verl.command import load_experiment, merge_dataflex

    block = load_experiment("verl_cpu_tiny").dataflex
    stapo = merge_dataflex(block, ["dataflex.scorer.name=entropy", "dataflex.actuator.name=stapo"])
    assert stapo["actuator"] == {"name": "stapo", "params": {"tau_p": 0.01, "entropy_quantile": 0.05}}
    sigmoid = merge_dataflex(block, ["dataflex.actuator.name=sigmoid_reweight", "dataflex.actuator.params.k=2"])
    assert sigmoid["actuator"]["params"] == {"k": 2.0, "tau": 0.5, "normalize": "mean"}
    lopti = merge_dataflex(block, ["dataflex.mechanism=isolate", "dataflex.actuator.name=lopti"])
    assert lopti["actuator"]["params"]["alpha"] == 0.5 and lopti["actuator"]["params"]["eta"] == 0.5
