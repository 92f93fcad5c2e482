"""Every YAML under conf/ parses, conf/train.yaml composes with every choice of its groups into a valid config, and
every dataflex preset builds a mechanism."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dataflex_rl import build_mechanism
from dataflex_rl.compose import compose_train_config, group_choices
from dataflex_rl.run_config import parse_train_config

CONF = Path(__file__).resolve().parents[1] / "conf"
TRAIN_GROUPS = ("dataflex", "model", "task", "trainer", "logger", "experiment")


@pytest.mark.parametrize("preset", group_choices("dataflex"))
def test_dataflex_presets_build(preset):
    block = compose_train_config(["run_dir=x", f"dataflex={preset}"])["dataflex"]
    assert build_mechanism(block).config.mechanism == block["mechanism"]


def test_every_yaml_parses():
    files = sorted(CONF.rglob("*.yaml"))
    assert files, "conf/ has no YAML files"
    for path in files:
        OmegaConf.load(path)


@pytest.mark.parametrize("group", TRAIN_GROUPS)
def test_train_composes_with_every_choice_of_its_groups(group):
    choices = group_choices(group)
    assert choices, f"the train config group {group} has no choices"
    for choice in choices:
        parse_train_config(compose_train_config(["run_dir=x", f"{group}={choice}"]))


def test_overrides_reach_the_stored_defaults_with_their_types():
    config = parse_train_config(compose_train_config([
        "run_dir=x", "trainer.max_new_tokens=5", "trainer.grad_clip=null", "stats.bucket_edges=[0.5]",
        "task.ops=[+,-]", "logger.wandb.entity=team", "seed=3", "axes=[seed]"]))
    assert (config.trainer.max_new_tokens, config.trainer.grad_clip, config.stats.bucket_edges) == (5, None, (0.5,))
    assert (config.task.built.config.ops, config.logger.wandb.entity, config.seed, config.axes) == (
        ("+", "-"), "team", 3, ("seed",))


def test_each_experiment_keeps_the_model_depth_its_results_were_measured_with():
    """docs/results: the default sweep's with 2 layers (sft_search_layers), K&K's and long addition's with 4."""
    depth = {name: parse_train_config(compose_train_config(["run_dir=x", *extra])).model.num_layers
             for name, extra in (("default", []), ("kk", ["experiment=kk"]),
                                 ("long_addition", ["experiment=long_addition"]))}
    assert depth == {"default": 2, "kk": 4, "long_addition": 4}
    verl_cpu = OmegaConf.load(CONF / "verl_experiment" / "verl_cpu_tiny.yaml")
    assert "model.num_layers=4" in verl_cpu.prepare.overrides


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.lrr=1", "trainer.lrr = '1' is not allowed: trainer has no key 'lrr'; allowed keys of trainer: "
                      "total_steps, prompts_per_step"),
    ("model=../task/arithmetic", "model = '../task/arithmetic' is not allowed: a model is the name of a file"),
    ("trainer.lr=-1", "trainer.lr = -1 is not allowed: it must be > 0.0"),
])
def test_a_bad_override_is_refused_naming_key_value_and_what_is_allowed(override, message):
    from dataflex_rl.validation import ConfigError

    with pytest.raises(ConfigError) as error:
        parse_train_config(compose_train_config(["run_dir=x", override]))
    assert message in str(error.value)
