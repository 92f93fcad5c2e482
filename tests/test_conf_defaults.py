"""Each default agrees in its two spellings: a config built in Python equals the one the command line composes.

The YAML under ``conf/`` is what a user reads and edits; the typed schemas (dataclasses) are what a notebook, a
benchmark or a test builds with no YAML at hand. These tests compose every default YAML with Hydra, validate it with
the same parser the entry point uses, and compare it with the schema's own defaults, so a value changed in one place
and not the other fails here instead of making two runs of "the same config" train differently.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dataflex_rl.local.config import ModelConfig, SFTConfig, StatsConfig, TrainerConfig, parse_train_config
from dataflex_rl.tasks import build_task
from dataflex_rl.tracking import parse_logger_config
from dataflex_rl.tracking.build import LoggerConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def _compose(config_name: str, overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides or [])


@pytest.fixture(scope="module")
def train_config():
    return parse_train_config(_compose("train", ["run_dir=runs/x"]))


@pytest.mark.parametrize("section, schema", [("model", ModelConfig), ("sft", SFTConfig),
                                             ("trainer", TrainerConfig), ("stats", StatsConfig)])
def test_train_sections_equal_their_schema_defaults(train_config, section, schema):
    assert getattr(train_config, section) == schema(), f"conf/ and {schema.__name__}'s defaults disagree"


def test_top_level_train_defaults_equal_the_schema(train_config):
    fields = {field.name: field.default for field in dataclasses.fields(type(train_config))
              if field.default is not dataclasses.MISSING}
    assert fields, "TrainConfig declares no defaults"
    for name, default in fields.items():
        assert getattr(train_config, name) == default, f"{name}: conf/train.yaml vs TrainConfig default"


def test_logger_group_equals_the_schema_defaults(train_config):
    assert train_config.logger == LoggerConfig() == parse_logger_config(None)


@pytest.mark.parametrize("path", sorted((CONF / "task").glob("*.yaml")), ids=lambda p: p.stem)
def test_task_yaml_equals_its_config_class_defaults(path):
    params = OmegaConf.to_container(OmegaConf.load(path))
    name = params.pop("name")
    assert build_task(name, params).config == build_task(name, {}).config, f"{path.name} vs the task's defaults"


def test_sweep_defaults_equal_the_schema():
    from sweeps.cli import compose_config
    from sweeps.config import SweepConfig, parse_sweep_config

    parsed = parse_sweep_config(compose_config("default", []))
    built = SweepConfig()
    for field in dataclasses.fields(SweepConfig):
        if field.name == "launcher_settings":
            continue
        assert getattr(parsed, field.name) == getattr(built, field.name), f"sweeps.{field.name}"


@pytest.mark.parametrize("launcher", sorted(path.stem for path in (CONF / "sweeps" / "launcher").glob("*.yaml")))
def test_launcher_blocks_equal_their_settings_defaults(launcher):
    from sweeps.cli import compose_config
    from sweeps.config import parse_sweep_config
    from sweeps.launchers import launcher_class

    parsed = parse_sweep_config(compose_config("default", [f"launcher={launcher}"]))
    settings_class = launcher_class(launcher).settings
    if settings_class is None:
        assert parsed.launcher_settings is None
    else:
        assert parsed.launcher_settings == settings_class(), f"conf/sweeps/launcher/{launcher}.yaml"


def _make_help_defaults() -> dict[str, str]:
    text = (ROOT / "Makefile").read_text()
    return dict(re.findall(r"^#> (\w+)\s.*\(default:? ([^)]*)\)", text, flags=re.M))


def test_make_help_states_the_configs_defaults():
    from sweeps.config import SweepConfig

    stated = _make_help_defaults()
    built = SweepConfig()
    seeds = ",".join(map(str, built.seeds))
    assert stated.get("SEEDS", "").replace(" ", "") in (seeds, f"{built.seeds[0]}..{built.seeds[-1]}"), stated
    assert stated.get("STEPS", "").split()[0] == str(built.local_steps), stated
