"""The seams between the schema and the components: validated Params reach the mechanism as they are, scorers
reuse the mechanism's token probabilities through a hook, and staging is the actuator's."""

from __future__ import annotations

import dataclasses

import torch

from dataflex_rl import build_mechanism, parse_dataflex_config
from dataflex_rl.actuators import ACTUATORS
from dataflex_rl.scorers import SCORERS, Scorer
from tests import registry_snapshot


def _fields(probs: list[list[float]]) -> dict[str, torch.Tensor]:
    token_probs = torch.tensor(probs)
    return {"old_log_probs": token_probs.log(), "response_mask": torch.ones_like(token_probs),
            "advantages": torch.ones_like(token_probs)}


def test_the_mechanism_keeps_the_params_the_schema_validated():
    config = parse_dataflex_config({"actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}}})
    mechanism = build_mechanism(config)
    assert mechanism.actuator.params is config.actuator.validated and mechanism.actuator.params.alpha == 0.5
    by_hand = dataclasses.replace(config, actuator=dataclasses.replace(config.actuator, validated=None))
    assert by_hand == config  # the kept instance is not part of equality
    assert build_mechanism(by_hand).actuator.params == config.actuator.validated


def test_a_scorer_with_its_own_signal_is_scored_not_replaced_by_pi():
    with registry_snapshot(SCORERS):
        @SCORERS.register("constant_half")
        class ConstantHalf(Scorer):
            signal = "token_prob"  # the same signal kind as pi, but its own numbers
            required_fields = ("response_mask",)

            def score(self, fields, token_probs):
                return torch.full(fields["response_mask"].shape, 0.5)

        mechanism = build_mechanism({"scorer": {"name": "constant_half"},
                                     "actuator": {"name": "advantage_reweight",
                                                  "params": {"alpha": 1.0, "normalize": "none"}}})
        # w = alpha * signal + (1 - alpha) = 0.5 everywhere, whatever pi is
        output = mechanism.process(0, _fields([[0.1, 0.9]]))
    assert torch.equal(output.weights, torch.full((1, 2), 0.5))


def test_staging_is_the_actuators_and_the_registry_names_each_class():
    assert [name for name in ACTUATORS.names() if ACTUATORS.get(name).staged] == ["lopti"]
    assert build_mechanism({"mechanism": "isolate"}).staged and not build_mechanism({}).staged
    assert all(ACTUATORS.get(name).name == name for name in ACTUATORS.names())
    assert all(SCORERS.get(name).name == name for name in SCORERS.names())
