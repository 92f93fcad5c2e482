"""Tier 1 and 2: the reweight mechanism's math against hand-derived values, and its invariants."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflex_rl import build_mechanism, keys
from dataflex_rl.actuators import AdvantageReweight, masked_mean_normalize
from tests.core.devices import DEVICES, assert_on, on


def make_config(alpha=0.5, normalize="mean", warmup_step=0):
    return {
        "mechanism": "reweight",
        "scorer": {"name": "token_prob"},
        "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha, "normalize": normalize}},
        "warmup_step": warmup_step,
    }


def fields_from(probs, mask, advantages=None, device="cpu"):
    probs = torch.tensor(probs, dtype=torch.float32)
    mask = torch.tensor(mask)
    if advantages is None:
        advantages = torch.ones_like(probs)
    return on(device, {
        "old_log_probs": probs.log(),
        "response_mask": mask,
        "advantages": torch.as_tensor(advantages, dtype=torch.float32),
    })


def test_hand_derived_weights_raw_and_normalised(device):
    # pi = 0.1, 0.5, 0.9, alpha = 0.5: raw = 0.5 * pi + 0.5 = 0.55, 0.75, 0.95; their mean is 0.75,
    # so mean-normalised = 0.55/0.75, 1, 0.95/0.75 = 0.7333.., 1.0, 1.2666..
    fields = fields_from([[0.1, 0.5, 0.9]], [[1, 1, 1]], device=device)
    raw, _ = build_mechanism(make_config(normalize="none")).compute_weights(0, fields)
    assert_on(device, raw)
    torch.testing.assert_close(raw.cpu(), torch.tensor([[0.55, 0.75, 0.95]]))
    normalised, metrics = build_mechanism(make_config()).compute_weights(0, fields)
    torch.testing.assert_close(normalised.cpu(), torch.tensor([[0.55 / 0.75, 1.0, 0.95 / 0.75]]))
    assert metrics[keys.WEIGHT_PREFIX + "/mean"] == pytest.approx(1.0)
    assert metrics[keys.WEIGHT_PREFIX + "/min"] == pytest.approx(0.55 / 0.75)
    assert metrics[keys.WEIGHT_PREFIX + "/max"] == pytest.approx(0.95 / 0.75)
    # Population std of (0.7333, 1, 1.2667): sqrt(((0.2667)^2 * 2) / 3) = 0.21773
    assert metrics[keys.WEIGHT_PREFIX + "/std"] == pytest.approx(math.sqrt(2 * (0.2 / 0.75) ** 2 / 3), rel=1e-5)
    assert metrics[keys.TOKEN_PROB_MEAN] == pytest.approx(0.5)
    assert metrics[keys.TOKEN_PROB_LOW_FRAC] == pytest.approx(1 / 3)  # only 0.1 is below 0.5
    assert metrics[keys.ACTIVE] == 1.0


def test_apply_multiplies_advantages_and_masks_are_zero_weight(device):
    # Two rows, the second with one padded token; alpha = 1: raw weights are pi itself.
    fields = fields_from([[0.2, 0.6], [0.4, 0.3]], [[1, 1], [1, 0]], advantages=[[1.0, -2.0], [3.0, 5.0]],
                         device=device)
    mech = build_mechanism(make_config(alpha=1.0))
    weights, _ = mech.compute_weights(0, fields)
    mean = (0.2 + 0.6 + 0.4) / 3
    torch.testing.assert_close(weights.cpu(), torch.tensor([[0.2 / mean, 0.6 / mean], [0.4 / mean, 0.0]]))
    advantages, _ = mech.apply(0, fields)
    assert_on(device, advantages)
    expected = torch.tensor([[1.0 * 0.2 / mean, -2.0 * 0.6 / mean], [3.0 * 0.4 / mean, 5.0]])
    torch.testing.assert_close(advantages.cpu(), expected)  # the masked advantage passes through untouched


def test_alpha_zero_is_bit_for_bit_identity(device):
    generator = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(64, 97, generator=generator) * 8
    mask = torch.rand(64, 97, generator=generator) > 0.2
    advantages = torch.randn(64, 97, generator=generator)
    fields = on(device, {"old_log_probs": log_probs, "response_mask": mask, "advantages": advantages})
    out, _ = build_mechanism(make_config(alpha=0.0)).apply(5, fields)
    assert torch.equal(out.cpu(), advantages)
    weights, _ = build_mechanism(make_config(alpha=0.0)).compute_weights(5, fields)
    weights = weights.cpu()
    assert torch.equal(weights[mask], torch.ones(int(mask.sum())))
    assert torch.equal(weights[~mask], torch.zeros(int((~mask).sum())))


def test_alpha_zero_exact_on_large_batch(device):
    # 512 x 4096 ones: the float64 mean keeps 1.0 exact.
    mask = torch.ones(512, 4096, dtype=torch.bool, device=device)
    raw = torch.ones(512, 4096, device=device)
    assert torch.equal(masked_mean_normalize(raw, mask), raw)


@settings(max_examples=40, deadline=None)
@given(
    alpha=st.floats(0.0, 1.0),
    rows=st.integers(1, 6),
    cols=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("device", DEVICES)
def test_normalised_weights_average_one_and_masked_positions_change_nothing(device, alpha, rows, cols, seed):
    generator = torch.Generator().manual_seed(seed)
    log_probs = -torch.rand(rows, cols, generator=generator) * 6
    mask = torch.rand(rows, cols, generator=generator) > 0.3
    advantages = torch.randn(rows, cols, generator=generator)
    fields = {"old_log_probs": log_probs, "response_mask": mask, "advantages": advantages}
    mech = build_mechanism(make_config(alpha=alpha))
    weights, _ = mech.compute_weights(0, on(device, fields))
    out, _ = mech.apply(0, on(device, fields))
    weights, out = weights.cpu(), out.cpu()
    if mask.any():
        assert float(weights[mask].double().mean()) == pytest.approx(1.0, abs=1e-5)
    assert torch.all(weights[~mask] == 0)
    # Garbage (NaN, +inf, positive log-probs, huge advantages) at masked positions changes nothing valid.
    garbage = {
        "old_log_probs": torch.where(mask, log_probs, torch.full_like(log_probs, float("nan"))),
        "response_mask": mask,
        "advantages": torch.where(mask, advantages, torch.full_like(advantages, 1e30)),
    }
    garbage["old_log_probs"][~mask] = torch.where(
        torch.arange((~mask).sum()) % 2 == 0, torch.tensor(float("inf")), torch.tensor(3.0)
    ) if (~mask).any() else garbage["old_log_probs"][~mask]
    weights_g, metrics_g = mech.compute_weights(0, on(device, garbage))
    out_g, _ = mech.apply(0, on(device, garbage))
    weights_g, out_g = weights_g.cpu(), out_g.cpu()
    assert torch.equal(weights_g, weights)
    assert torch.equal(out_g[mask], out[mask])
    assert all(math.isfinite(value) for value in metrics_g.values())


def test_no_valid_token_gives_zeros_and_no_nan(device):
    fields = fields_from([[0.5, 0.5]], [[0, 0]], advantages=[[1.0, 2.0]], device=device)
    weights, metrics = build_mechanism(make_config()).compute_weights(0, fields)
    assert torch.equal(weights.cpu(), torch.zeros(1, 2))
    assert all(math.isfinite(value) for value in metrics.values())
    out, _ = build_mechanism(make_config()).apply(0, fields)
    assert not torch.isnan(out).any()


def test_warmup_returns_advantages_unchanged_then_activates(device):
    fields = fields_from([[0.1, 0.9]], [[1, 1]], advantages=[[1.0, 1.0]], device=device)
    mech = build_mechanism(make_config(alpha=1.0, warmup_step=3))
    out, metrics = mech.apply(2, fields)
    assert out is fields["advantages"]
    assert metrics[keys.ACTIVE] == 0
    assert keys.TOKEN_PROB_MEAN in metrics  # diagnostics still logged during warmup
    weights, _ = mech.compute_weights(2, fields)
    assert_on(device, weights)
    assert torch.equal(weights.cpu(), torch.ones(1, 2))
    out, metrics = mech.apply(3, fields)
    assert metrics[keys.ACTIVE] == 1
    torch.testing.assert_close(out.cpu(), torch.tensor([[0.2, 1.8]]))  # pi / mean(pi), mean = 0.5


def test_bf16_input_computes_in_float32_and_returns_bf16(device):
    probs = torch.tensor([[0.1, 0.5, 0.9]])
    fields = on(device, {
        "old_log_probs": probs.log().to(torch.bfloat16),
        "response_mask": torch.ones(1, 3, dtype=torch.bool),
        "advantages": torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.bfloat16),
    })
    out, _ = build_mechanism(make_config()).apply(0, fields)
    assert out.dtype == torch.bfloat16
    assert_on(device, out)
    torch.testing.assert_close(out.float().cpu(), torch.tensor([[0.7333, 1.0, 1.2667]]), atol=1e-2, rtol=1e-2)
    weights, _ = build_mechanism(make_config()).compute_weights(0, fields)
    assert weights.dtype == torch.float32
    identity, _ = build_mechanism(make_config(alpha=0.0)).apply(0, fields)
    assert torch.equal(identity, fields["advantages"])


def test_invalid_log_probs_on_valid_tokens_raise_with_count_and_position(device):
    fields = fields_from([[0.5, 0.5, 0.5]], [[1, 1, 1]], device=device)
    fields["old_log_probs"][0, 1] = float("nan")
    fields["old_log_probs"][0, 2] = 0.3
    with pytest.raises(ValueError, match=r"2 valid token\(s\).*\(0, 1\)"):
        build_mechanism(make_config()).apply(0, fields)


def test_missing_field_and_shape_mismatch_are_named():
    fields = fields_from([[0.5]], [[1]])
    del fields["old_log_probs"]
    with pytest.raises(KeyError, match="old_log_probs"):
        build_mechanism(make_config()).apply(0, fields)
    fields = fields_from([[0.5, 0.5]], [[1, 1]])
    fields["advantages"] = torch.ones(1, 3)
    with pytest.raises(ValueError, match="advantages.*shape"):
        build_mechanism(make_config()).apply(0, fields)


def test_histograms_count_valid_tokens_on_fixed_edges(device):
    fields = fields_from([[0.11, 0.51, 0.91, 0.95]], [[1, 1, 1, 0]], device=device)
    hists = build_mechanism(make_config()).histograms(0, fields)
    prob = hists[keys.HIST_TOKEN_PROB]
    weight = hists[keys.HIST_WEIGHT]
    assert prob.counts.sum() == 3 and weight.counts.sum() == 3
    assert len(prob.edges) == len(prob.counts) + 1
    # 0.11 is in bin [0.10, 0.12) -> index 5 of 50; 0.51 -> 25; 0.91 -> 45
    assert list(prob.counts.nonzero()[0]) == [5, 25, 45]


def test_actuator_used_directly(device):
    actuator = AdvantageReweight(AdvantageReweight.Params(alpha=0.25, normalize="none"))
    signal = torch.tensor([[0.0, 1.0]], device=device)
    weights = actuator.weights(signal, torch.tensor([[True, True]], device=device))
    assert_on(device, weights)
    torch.testing.assert_close(weights.cpu(), torch.tensor([[0.75, 1.0]]))


def test_weight_quantiles_exact_on_small_batches(device):
    generator = torch.Generator().manual_seed(3)
    probs = torch.rand(8, 50, generator=generator).clamp_min(1e-4)
    mask = torch.rand(8, 50, generator=generator) > 0.25
    fields = on(device, {"old_log_probs": probs.log(), "response_mask": mask, "advantages": torch.ones(8, 50)})
    weights, metrics = build_mechanism(make_config(alpha=0.7)).compute_weights(0, fields)
    weights = weights.cpu()
    expected = torch.quantile(weights[mask], torch.tensor([0.05, 0.5, 0.95]), interpolation="lower").tolist()
    for name, value in zip(("p05", "p50", "p95"), expected):
        assert metrics[f"{keys.WEIGHT_PREFIX}/{name}"] == pytest.approx(value, rel=1e-6)


def test_weight_quantiles_sampled_on_large_batches_are_close(device):
    generator = torch.Generator().manual_seed(4)
    probs = torch.rand(256, 1024, generator=generator).clamp_min(1e-4)
    mask = torch.rand(256, 1024, generator=generator) > 0.1
    fields = on(device, {"old_log_probs": probs.log(), "response_mask": mask, "advantages": torch.ones(256, 1024)})
    weights, metrics = build_mechanism(make_config(alpha=1.0)).compute_weights(0, fields)
    weights = weights.cpu()
    exact = torch.quantile(weights[mask][:2**24], torch.tensor([0.05, 0.5, 0.95])).tolist()
    spread = float(weights[mask].max() - weights[mask].min())
    for name, value in zip(("p05", "p50", "p95"), exact):
        assert abs(metrics[f"{keys.WEIGHT_PREFIX}/{name}"] - value) < 0.02 * spread


@pytest.mark.slow
def test_compiled_mechanism_matches_eager():
    generator = torch.Generator().manual_seed(5)
    fields = {
        "old_log_probs": -torch.rand(16, 33, generator=generator) * 4,
        "response_mask": torch.rand(16, 33, generator=generator) > 0.2,
        "advantages": torch.randn(16, 33, generator=generator),
    }
    eager_out, eager_metrics = build_mechanism(make_config(alpha=0.3)).apply(1, fields)
    compiled = build_mechanism(make_config(alpha=0.3), compile=True)
    out, compiled_metrics = compiled.apply(1, fields)
    torch.testing.assert_close(out, eager_out)
    assert compiled_metrics.keys() == eager_metrics.keys()
    for key, value in eager_metrics.items():
        # float32 reductions in another order: the std from E[w^2] - E[w]^2 keeps about 5 significant digits.
        assert compiled_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6)
    identity, _ = build_mechanism(make_config(alpha=0.0), compile=True).apply(1, fields)
    assert torch.equal(identity, fields["advantages"])
