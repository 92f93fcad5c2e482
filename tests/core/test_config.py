"""Validation of the dataflex block: every bad input is refused with key, value and what is allowed."""

import dataclasses
import math

import pytest
from omegaconf import OmegaConf

from dataflex_rl import ConfigError, DataflexConfig, build_mechanism, parse_dataflex_config
from dataflex_rl.actuators import ACTUATORS, Actuator
from dataflex_rl.scorers import SCORERS, Scorer
from tests import registry_snapshot


def block(**overrides):
    cfg = {
        "mechanism": "reweight",
        "scorer": {"name": "token_prob"},
        "actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}},
        "warmup_step": 0,
    }
    cfg.update(overrides)
    return cfg


def test_parses_dict_and_dictconfig_into_frozen_dataclasses():
    parsed = parse_dataflex_config(OmegaConf.create(block()))
    assert isinstance(parsed, DataflexConfig)
    # defaults filled in
    assert parsed.actuator.params == {"alpha": 0.5, "normalize": "mean", "tau": None, "neg_adv_weight": 1.0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.warmup_step = 3
    with pytest.raises(TypeError):
        parsed.actuator.params["alpha"] = 1.0  # read-only mapping
    assert parse_dataflex_config(parsed) is parsed
    assert parse_dataflex_config(parsed.to_dict()) == parsed


def test_defaults_fill_missing_components():
    parsed = parse_dataflex_config({"mechanism": "reweight"})
    assert parsed.scorer.name == "token_prob" and parsed.actuator.name == "advantage_reweight"
    assert parsed.actuator.params["alpha"] == 0.5 and parsed.warmup_step == 0


@pytest.mark.parametrize(
    ("cfg", "pattern"),
    [
        (block(mechanism="resample"),
         r"dataflex\.mechanism = 'resample' is not allowed; allowed values: 'isolate', 'reweight'"),
        (block(scorer={"name": "gradient_norm"}), r"dataflex\.scorer\.name = 'gradient_norm'.*registered scorers: entropy, token_prob"),
        (block(actuator={"name": "clip"}), r"dataflex\.actuator\.name = 'clip'.*advantage_reweight"),
        (block(actuator={"name": "advantage_reweight", "params": {"beta": 1}}),
         r"dataflex\.actuator\.params: unknown key\(s\) 'beta'; allowed keys: alpha, normalize"),
        (block(scorer={"name": "token_prob", "params": {"temperature": 2}}),
         r"dataflex\.scorer\.params: unknown key\(s\) 'temperature'; allowed keys: \(none\)"),
        (block(actuator={"name": "advantage_reweight", "params": {"alpha": 1.5}}),
         r"dataflex\.actuator\.params\.alpha = 1\.5 is not allowed: it must be in \[0, 1\]"),
        (block(actuator={"name": "advantage_reweight", "params": {"alpha": -0.1}}), r"alpha = -0\.1"),
        (block(actuator={"name": "advantage_reweight", "params": {"alpha": math.nan}}),
         r"alpha = nan is not allowed: it must be a finite number"),
        (block(actuator={"name": "advantage_reweight", "params": {"alpha": "0.5"}}), r"alpha = '0\.5'"),
        (block(actuator={"name": "advantage_reweight", "params": {"alpha": True}}), r"alpha = True"),
        (block(actuator={"name": "advantage_reweight", "params": {"normalize": "sum"}}),
         r"normalize = 'sum' is not allowed; allowed values: 'mean', 'none'"),
        (block(warmup_step=-1), r"dataflex\.warmup_step = -1 .*integer >= 0"),
        (block(warmup_step=1.5), r"dataflex\.warmup_step = 1\.5"),
        (block(warmup_step="3"), r"dataflex\.warmup_step = '3'"),
        (block(extra=1), r"dataflex: unknown key\(s\) 'extra'; allowed keys: mechanism, scorer, actuator"),
        (block(scorer={"nme": "token_prob"}), r"dataflex\.scorer = .*must be a mapping with a 'name'"),
        (block(scorer={"name": "token_prob", "param": {}}), r"dataflex\.scorer: unknown key\(s\) 'param'"),
        ([1, 2], r"dataflex = \[1, 2\] is not allowed"),
    ],
)
def test_bad_input_is_refused_with_key_value_and_allowed(cfg, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_mechanism(cfg)


class _EntropyScorer(Scorer):
    signal = "entropy"
    required_fields = ("entropys",)


def test_incompatible_scorer_actuator_pairs_are_refused():
    with registry_snapshot(SCORERS):
        SCORERS.register("entropy_test")(_EntropyScorer)
        with pytest.raises(ConfigError, match="produces a 'entropy' signal.*consumes only \\['token_prob'\\]"):
            build_mechanism(block(scorer={"name": "entropy_test"}))

    class _AnyActuator(Actuator):
        signals = frozenset({"entropy"})

    with registry_snapshot(SCORERS), registry_snapshot(ACTUATORS):
        SCORERS.register("entropy_test")(_EntropyScorer)
        ACTUATORS.register("any_test")(_AnyActuator)
        with pytest.raises(ConfigError, match=r"requires batch field\(s\) \['entropys'\]"):
            build_mechanism(block(scorer={"name": "entropy_test"}, actuator={"name": "any_test"}))
    assert "entropy_test" not in SCORERS and "any_test" not in ACTUATORS  # snapshots restored


def test_staged_actuator_under_a_single_update_mechanism_is_refused_at_parse_time():
    # Refused by the config check itself, so sweeps and the verl command builder catch it before any run starts.
    with pytest.raises(ConfigError, match=r"actuator\.name = 'lopti' cannot drive dataflex\.mechanism = 'reweight'"):
        parse_dataflex_config(block(actuator={"name": "lopti", "params": {"eta": 0.5}}))
