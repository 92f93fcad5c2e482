"""The probability-change metric (how one update moved each token's pi) on a case whose answer is known by hand, and
the probability-band actuator (the AR paper's quartile experiment) at its edges."""

from __future__ import annotations

import math

import pytest
import torch

from dataflex_rl import ConfigError, build_mechanism, keys
from dataflex_rl.metrics import prob_change_stats

HIGH, LOW = "0.75-1.00", "0.00-0.25"


def test_one_sgd_step_on_a_two_token_vocabulary_moves_pi_as_derived_by_hand():
    """One position, vocabulary {0, 1}, logits z with softmax p = (0.8, 0.2); three sampled tokens: 0 with A = +1,
    1 with A = +1, 0 with A = -1. The loss -sum_t A_t log p(y_t) has gradient -sum_t A_t (e_{y_t} - p) = -(e_1 - p)
    = (0.8, -0.8) in z, so one SGD step of 0.5 gives z' = z + 0.4 (-1, 1) and p'_0 = 0.8 e^-0.4 / (0.8 e^-0.4 +
    0.2 e^0.4) = 0.642515: token 0 loses 0.157485 and token 1 gains it. The low-probability positive token dominates:
    the high-probability positive token moves the wrong way (down), the negative one the right way (down)."""
    logits = torch.nn.Parameter(torch.tensor([0.8, 0.2]).log())
    tokens = torch.tensor([0, 1, 0])
    advantages = torch.tensor([[1.0, 1.0, -1.0]])
    old = torch.log_softmax(logits, -1)[tokens].detach().unsqueeze(0)
    loss = -(advantages[0] * torch.log_softmax(logits, -1)[tokens]).sum()
    loss.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    new = torch.log_softmax(logits, -1)[tokens].detach().unsqueeze(0)
    stats = prob_change_stats(old, new, advantages, torch.ones(1, 3, dtype=torch.bool))

    p0 = 0.8 * math.exp(-0.4) / (0.8 * math.exp(-0.4) + 0.2 * math.exp(0.4))
    assert p0 == pytest.approx(0.642515, abs=1e-6)
    assert stats[keys.prob_change("pos", HIGH, "mean_delta")] == pytest.approx(p0 - 0.8, abs=1e-6)
    assert stats[keys.prob_change("pos", HIGH, "correct_share")] == 0.0
    assert stats[keys.prob_change("pos", LOW, "mean_delta")] == pytest.approx(0.8 - p0, abs=1e-6)
    assert stats[keys.prob_change("pos", LOW, "correct_share")] == 1.0
    assert stats[keys.prob_change("neg", HIGH, "correct_share")] == 1.0
    for sign, label in (("pos", HIGH), ("pos", LOW), ("neg", HIGH)):
        assert stats[keys.prob_change(sign, label, "token_share")] == pytest.approx(1 / 3)
    assert stats[keys.prob_change("neg", LOW, "token_share")] == 0.0  # empty cells are 0
    assert stats[keys.PROB_CHANGE_CORRECT_SHARE] == pytest.approx(2 / 3)


def test_masked_zero_advantage_and_unchanged_tokens(device):
    old = torch.tensor([[0.6, 0.6, 0.6, 0.9]], device=device).log()
    new = torch.tensor([[0.7, 0.6, 0.5, 0.1]], device=device).log()  # the last is padding: never counted
    stats = prob_change_stats(old, new, torch.tensor([[1.0, 1.0, 0.0, 1.0]], device=device),
                              torch.tensor([[True, True, True, False]], device=device))
    label = "0.50-0.75"
    assert stats[keys.prob_change("pos", label, "token_share")] == pytest.approx(2 / 3)  # the A = 0 token: neither
    assert stats[keys.prob_change("pos", label, "correct_share")] == 0.5  # the unchanged one did not move up
    assert stats[keys.prob_change("pos", label, "mean_delta")] == pytest.approx(0.05)
    assert stats[keys.PROB_CHANGE_CORRECT_SHARE] == 0.5


# --- the probability band --------------------------------------------------------------------------------------------
def band(**params):
    return build_mechanism({"mechanism": "reweight", "scorer": {"name": "token_prob"},
                            "actuator": {"name": "prob_band", "params": params}})


def test_band_keeps_low_and_drops_high_at_the_edges():
    # pi exactly at the edges: 0.25 is in [0.25, 0.5) and not in [0, 0.25); 1.0 is in the closed last band.
    probs = torch.tensor([[0.1, 0.25, 0.4999, 0.5, 1.0]])
    fields = {"old_log_probs": probs.log(), "response_mask": torch.ones(1, 5, dtype=torch.bool),
              "advantages": torch.tensor([[1.0, -2.0, 3.0, -4.0, 5.0]])}
    assert band(low=0.0, high=0.25).process(1, fields).advantages.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert band(low=0.25, high=0.5).process(1, fields).advantages.tolist() == [[0.0, -2.0, 3.0, 0.0, 0.0]]
    top = band(low=0.75, high=1.0).process(1, fields)
    assert top.advantages.tolist() == [[0.0, 0.0, 0.0, 0.0, 5.0]]
    assert top.metrics[keys.KEPT_TOKEN_FRAC] == pytest.approx(0.2)
    # normalize: mean scales the kept tokens by valid / kept (here 5 / 2)
    mean = band(low=0.25, high=0.5, normalize="mean").process(1, fields).weights
    torch.testing.assert_close(mean, torch.tensor([[0.0, 2.5, 2.5, 0.0, 0.0]]))


def test_band_over_the_whole_interval_is_the_baseline_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    fields = {"old_log_probs": -torch.rand(4, 9, generator=generator) * 6, "advantages": torch.randn(4, 9),
              "response_mask": torch.rand(4, 9, generator=generator) > 0.3}
    assert torch.equal(band(low=0.0, high=1.0).process(1, fields).advantages, fields["advantages"])


@pytest.mark.parametrize(("params", "message"), [
    ({"low": 0.5, "high": 0.5}, r"high = 0.5 is not allowed with low = 0.5: the band \[low, high\) needs low < high"),
    ({"low": -0.1}, r"params\.low = -0.1 is not allowed"),
    ({"high": 1.5}, r"params\.high = 1.5 is not allowed"),
])
def test_bad_bands_are_refused_naming_key_value_and_allowed(params, message):
    with pytest.raises(ConfigError, match=message):
        band(**params)
