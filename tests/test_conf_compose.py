"""Every YAML under conf/ composes with Hydra, and every dataflex preset builds a mechanism."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dataflex_rl import build_mechanism

CONF = Path(__file__).resolve().parents[1] / "conf"


def _group_files(group):
    return sorted((CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("path", _group_files("dataflex"), ids=lambda p: p.stem)
def test_dataflex_presets_build(path):
    mechanism = build_mechanism(OmegaConf.load(path))
    assert mechanism.config.mechanism == OmegaConf.load(path).mechanism


def test_every_yaml_parses():
    files = sorted(CONF.rglob("*.yaml"))
    assert files, "conf/ has no YAML files"
    for path in files:
        OmegaConf.load(path)


def _primary_configs():
    return sorted(path.stem for path in CONF.glob("*.yaml"))


@pytest.mark.parametrize("name", _primary_configs())
def test_primary_configs_compose_with_every_option_of_their_groups(name):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        base = compose(config_name=name)
        defaults = OmegaConf.load(CONF / f"{name}.yaml").get("defaults", [])
        groups = [next(iter(entry)) for entry in defaults if isinstance(entry, dict) or OmegaConf.is_dict(entry)]
        for group in groups:
            group = group.lstrip("/").split("@")[0]
            if group.startswith("override"):
                continue
            for option in _group_files(group):
                cfg = compose(config_name=name, overrides=[f"{group}={option.stem}"])
                if group == "dataflex":
                    build_mechanism(cfg.dataflex)
        assert base is not None
