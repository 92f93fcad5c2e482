"""Advantage Reweighting as the paper's code has it: independent ``tau`` and ``neg_adv_weight``.

The reference below restates the formula of the paper code's ``both_linear_normal`` variant (arXiv:2505.12929,
``compute_reweight_advantage`` in ``verl/trainer/ppo/ray_trainer.py`` of the authors' AR-Lopti repository)::

    A'_t = (k * exp(old_log_prob_t) + tau) * A_t          where A_t > 0
    A'_t = (k * exp(old_log_prob_t) + tau) * A_t * n      elsewhere (A_t <= 0)

with ``k = alpha`` (``reweight_k``), ``tau`` (``reweight_tau``) and ``n = neg_adv_weight``; no normalisation.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflex_rl import ConfigError, build_mechanism, keys
from dataflex_rl.actuators import AdvantageReweight
from tests.core.devices import assert_on, on


def ar_config(alpha=0.5, normalize="none", tau=None, neg_adv_weight=1.0, warmup_step=0):
    params = {"alpha": alpha, "normalize": normalize, "neg_adv_weight": neg_adv_weight}
    if tau is not None:
        params["tau"] = tau
    return {
        "mechanism": "reweight",
        "scorer": {"name": "token_prob"},
        "actuator": {"name": "advantage_reweight", "params": params},
        "warmup_step": warmup_step,
    }


def paper_both_linear_normal(advantages, old_log_probs, k, tau, neg_adv_weight):
    """The paper's formula, restated (see the module docstring)."""
    reweighted = (k * torch.exp(old_log_probs) + tau) * advantages
    return torch.where(advantages > 0, reweighted, reweighted * neg_adv_weight)


def random_fields(seed, rows=8, length=13):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) > 0.25
    return {
        "old_log_probs": -torch.rand(rows, length, generator=generator) * 5,
        "response_mask": mask,
        "advantages": torch.where(mask, torch.randn(rows, length, generator=generator), 0.0),
    }


# --- hand-derived ---------------------------------------------------------------------------------------------------
def test_independent_tau_hand_derived(device):
    # pi = 0.25, 0.5, 1.0; alpha = 0.4, tau = 0.2: raw = 0.3, 0.4, 0.6 (mean 13/30): normalised 9/13, 12/13, 18/13.
    fields = {
        "old_log_probs": torch.tensor([[0.25, 0.5, 1.0]]).log(),
        "response_mask": torch.tensor([[True, True, True]]),
        "advantages": torch.tensor([[1.0, -1.0, 2.0]]),
    }
    fields = on(device, fields)
    raw, _ = build_mechanism(ar_config(alpha=0.4, tau=0.2)).compute_weights(0, fields)
    torch.testing.assert_close(raw.cpu(), torch.tensor([[0.3, 0.4, 0.6]]))
    normalised, metrics = build_mechanism(ar_config(alpha=0.4, tau=0.2, normalize="mean")).compute_weights(0, fields)
    torch.testing.assert_close(normalised.cpu(), torch.tensor([[9 / 13, 12 / 13, 18 / 13]]))
    assert metrics[keys.WEIGHT_PREFIX + "/mean"] == pytest.approx(1.0)


def test_neg_adv_weight_hand_derived_after_normalisation(device):
    # alpha = 1, tau = 0: raw = pi = 0.2, 0.6, 0.4 (mean 0.4) -> 0.5, 1.5, 1.0; then x 0.5 where A < 0 (the second).
    # A = 0 (third token) is not negative: its weight keeps the normalised value.
    fields = {
        "old_log_probs": torch.tensor([[0.2, 0.6, 0.4]]).log(),
        "response_mask": torch.tensor([[True, True, True]]),
        "advantages": torch.tensor([[2.0, -2.0, 0.0]]),
    }
    fields = on(device, fields)
    mechanism = build_mechanism(ar_config(alpha=1.0, tau=0.0, neg_adv_weight=0.5, normalize="mean"))
    weights, _ = mechanism.compute_weights(0, fields)
    torch.testing.assert_close(weights.cpu(), torch.tensor([[0.5, 0.75, 1.0]]))
    advantages, _ = mechanism.apply(0, fields)
    assert_on(device, weights, advantages)
    torch.testing.assert_close(advantages.cpu(), torch.tensor([[1.0, -1.5, 0.0]]))


def test_neg_adv_weight_zero_drops_negative_advantages_only():
    fields = random_fields(1)
    advantages, _ = build_mechanism(ar_config(alpha=0.0, neg_adv_weight=0.0)).apply(0, fields)
    valid = fields["response_mask"]
    negative = valid & (fields["advantages"] < 0)
    assert negative.any()
    assert torch.equal(advantages[negative], torch.zeros(int(negative.sum())))
    assert torch.equal(advantages[valid & ~negative], fields["advantages"][valid & ~negative])


# --- equality with the paper's variant ------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.3, 0.7, 1.0])
def test_equals_paper_both_linear_normal_exactly(device, alpha):
    """normalize: none, tau = 1 - alpha (the default), neg_adv_weight = 1: bit for bit on valid tokens (both on the
    same device: exp may round differently on another one)."""
    fields = on(device, random_fields(2))
    ours, _ = build_mechanism(ar_config(alpha=alpha)).apply(0, fields)
    theirs = paper_both_linear_normal(fields["advantages"], fields["old_log_probs"], alpha, 1 - alpha, 1.0)
    valid = fields["response_mask"]
    assert torch.equal(ours[valid], theirs[valid])
    assert torch.equal(ours[~valid], fields["advantages"][~valid])  # masked positions pass through


@pytest.mark.parametrize(("alpha", "tau", "neg_adv_weight"), [(0.3, 0.7, 0.8), (0.5, 0.2, 1.0), (1.0, 0.0, 1.5)])
def test_equals_paper_formula_with_independent_knobs(device, alpha, tau, neg_adv_weight):
    fields = on(device, random_fields(3))
    ours, _ = build_mechanism(ar_config(alpha=alpha, tau=tau, neg_adv_weight=neg_adv_weight)).apply(0, fields)
    theirs = paper_both_linear_normal(fields["advantages"], fields["old_log_probs"], alpha, tau, neg_adv_weight)
    valid = fields["response_mask"]
    # (w * n) * A against (w * A) * n: equal up to one rounding.
    torch.testing.assert_close(ours[valid], theirs[valid], rtol=1e-6, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    alpha=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    tau_offset=st.floats(0.0, 2.0),
)
def test_property_paper_formula(alpha, seed, tau_offset):
    """Any alpha in [0, 1] and tau >= 0: the mechanism is the paper's formula (neg_adv_weight = 1: exactly)."""
    fields = random_fields(seed, rows=4, length=9)
    tau = tau_offset if alpha > 0 or tau_offset > 0 else 1.0
    ours, _ = build_mechanism(ar_config(alpha=alpha, tau=tau)).apply(0, fields)
    theirs = paper_both_linear_normal(fields["advantages"], fields["old_log_probs"], alpha, tau, 1.0)
    valid = fields["response_mask"]
    assert torch.equal(ours[valid], theirs[valid])


# --- defaults unchanged ---------------------------------------------------------------------------------------------
def test_defaults_are_bit_for_bit_the_previous_formula():
    """Without tau / neg_adv_weight: w = alpha * pi + (1 - alpha), mean-normalised, as before."""
    fields = random_fields(4, rows=16, length=31)
    valid = fields["response_mask"]
    for alpha in (0.0, 0.25, 0.5, 1.0):
        config = {"mechanism": "reweight", "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}}}
        weights, _ = build_mechanism(config).compute_weights(0, fields)
        probs = torch.where(valid, fields["old_log_probs"], 0.0).exp()
        raw = torch.where(valid, probs * alpha + (1.0 - alpha), 0.0)
        expected = raw / (raw.sum() / valid.sum())
        assert torch.equal(weights, expected)
        explicit, _ = build_mechanism(ar_config(alpha=alpha, tau=1.0 - alpha, normalize="mean")).compute_weights(
            0, fields)
        assert torch.equal(explicit, expected)
    identity, _ = build_mechanism(ar_config(alpha=0.0, normalize="mean")).apply(0, fields)
    assert torch.equal(identity, fields["advantages"])


def test_actuator_needs_advantages_only_for_neg_adv_weight(device):
    signal = torch.tensor([[0.5, 0.25]], device=device)
    mask = torch.tensor([[True, True]], device=device)
    plain = AdvantageReweight(AdvantageReweight.Params(alpha=0.5, normalize="none"))
    torch.testing.assert_close(plain.weights(signal, mask).cpu(), torch.tensor([[0.75, 0.625]]))
    negative = AdvantageReweight(AdvantageReweight.Params(alpha=0.5, normalize="none", neg_adv_weight=2.0))
    with pytest.raises(ValueError, match="neg_adv_weight = 2.0 needs the advantages"):
        negative.weights(signal, mask)
    weights = negative.weights(signal, mask, torch.tensor([[-1.0, 1.0]], device=device))
    assert_on(device, weights)
    torch.testing.assert_close(weights.cpu(), torch.tensor([[1.5, 0.625]]))


# --- validation -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "pattern"),
    [
        ({"tau": -0.1}, r"dataflex\.actuator\.params\.tau = -0\.1 is not allowed: it must be >= 0"),
        ({"tau": math.nan}, r"dataflex\.actuator\.params\.tau = nan is not allowed: it must be a finite number"),
        ({"tau": math.inf}, r"tau = inf is not allowed"),
        ({"tau": "0.5"}, r"tau = '0\.5' is not allowed"),
        ({"alpha": 0.0, "tau": 0.0}, r"tau = 0\.0 is not allowed with alpha = 0\.0: every weight would be 0"),
        ({"neg_adv_weight": -1}, r"dataflex\.actuator\.params\.neg_adv_weight = -1 is not allowed: it must be >= 0"),
        ({"neg_adv_weight": math.nan}, r"neg_adv_weight = nan is not allowed: it must be a finite number"),
        ({"neg_adv_weight": True}, r"neg_adv_weight = True is not allowed"),
        ({"gamma": 1}, r"unknown key\(s\) 'gamma'; allowed keys: alpha, normalize, tau, neg_adv_weight"),
    ],
)
def test_bad_tau_and_neg_adv_weight_are_refused(params, pattern):
    config = {"mechanism": "reweight", "actuator": {"name": "advantage_reweight", "params": params}}
    with pytest.raises(ConfigError, match=pattern):
        build_mechanism(config)


def test_tau_zero_is_allowed_with_positive_alpha():
    mechanism = build_mechanism(ar_config(alpha=0.5, tau=0.0))
    assert mechanism.actuator.params.tau == 0.0 and mechanism.actuator.params.effective_tau == 0.0
    assert build_mechanism(ar_config(alpha=0.3)).actuator.params.effective_tau == pytest.approx(0.7)
