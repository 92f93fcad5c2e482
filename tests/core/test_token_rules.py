"""The token rules beside AR, against their papers' formulas on hand-made batches.

- ``entropy_quantile`` (80/20, arXiv:2506.01939): TRL's ``get_high_entropy_mask`` restated below
  (``torch.quantile`` of the valid entropies at ``1 - rho``, keep ``entropy >= threshold``);
- ``stapo`` (arXiv:2602.15620): drop ``A > 0 and pi < tau_p and H < tau_h``, renormalise over the rest;
- ``sigmoid_reweight``: the AR paper code's ``both_sigmoid``, ``2 * sigmoid(k * (exp(log_prob) - tau)) * A``.
"""

from __future__ import annotations

import math

import pytest
import torch

from dataflex_rl import ConfigError, build_mechanism, keys
from dataflex_rl.actuators import masked_mean_normalize, masked_quantile_tensor
from dataflex_rl.mechanism import MechanismOutput
from tests.core.devices import on, on_cpu


def block(scorer: str, actuator: str, **params) -> dict:
    return {"mechanism": "reweight", "scorer": {"name": scorer}, "actuator": {"name": actuator, "params": params},
            "warmup_step": 0}


def high_entropy(**params):
    return build_mechanism(block("entropy", "entropy_quantile", **params))


def stapo(**params):
    return build_mechanism(block("entropy", "stapo", **params))


def sigmoid(**params):
    return build_mechanism(block("token_prob", "sigmoid_reweight", **params))


def fields(entropy, probs=None, advantages=None, mask=None):
    entropy = torch.tensor(entropy, dtype=torch.float32)
    mask = torch.ones_like(entropy, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    probs = torch.full_like(entropy, 0.5) if probs is None else torch.tensor(probs, dtype=torch.float32)
    advantages = torch.ones_like(entropy) if advantages is None else torch.tensor(advantages, dtype=torch.float32)
    return {"entropy": entropy, "old_log_probs": probs.log(), "response_mask": mask, "advantages": advantages}


def run(device: str, mechanism, batch: dict) -> MechanismOutput:
    """``mechanism.process(1, batch)`` on ``device``, the output brought back to the CPU."""
    return on_cpu(device, mechanism.process(1, on(device, batch)))


def assert_close(actual: torch.Tensor, expected: list) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype))


def trl_high_entropy_mask(entropies, mask, threshold):
    """TRL's ``GRPOTrainer.get_high_entropy_mask`` (one process), restated; TRL passes ``1 - top_entropy_quantile``."""
    non_pad = entropies[mask.bool()].float()
    if non_pad.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(non_pad, threshold)
    return ((entropies * mask.float()) >= entropy_threshold) & mask.bool()


# --- 80/20 high-entropy tokens ------------------------------------------------------------------------------------
def test_high_entropy_keeps_the_top_share_by_hand(device):
    # Valid entropies 0.1 .. 1.0 (10 tokens); rho = 0.2: q_0.8 at rank 0.8 * 9 = 7.2 -> 0.8 + 0.2 * 0.1 = 0.82,
    # so the tokens with 0.9 and 1.0 are kept (2 of 10 = rho); advantages elsewhere become 0.
    entropy = [[0.1, 0.9, 0.3, 0.4, 0.5], [0.6, 0.7, 0.8, 0.2, 1.0]]
    batch = fields(entropy, advantages=[[1, 2, 3, 4, 5], [-1, -2, -3, -4, -5]])
    output = run(device, high_entropy(rho=0.2), batch)
    expected = torch.tensor([[0.0, 1.0, 0, 0, 0], [0, 0, 0, 0, 1.0]])
    assert torch.equal(output.weights, expected)
    assert torch.equal(output.advantages, torch.tensor([[0.0, 2, 0, 0, 0], [0, 0, 0, 0, -5.0]]))
    assert output.metrics[keys.KEPT_TOKEN_FRAC] == pytest.approx(0.2)
    assert torch.equal(output.weights.bool(), trl_high_entropy_mask(batch["entropy"], batch["response_mask"], 0.8))


def test_high_entropy_keeps_every_token_tied_at_the_quantile(device):
    # 0.1, 0.5, 0.5, 0.5, 0.9; rho = 0.5: q_0.5 is 0.5 itself, so all three ties are kept (4 of 5 > rho).
    batch = fields([[0.1, 0.5, 0.5, 0.5, 0.9]])
    output = run(device, high_entropy(rho=0.5), batch)
    assert output.weights.tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0]]
    # rho = 0.2: q_0.8 at rank 3.2 -> 0.5 + 0.2 * 0.4 = 0.58: the ties are all dropped.
    assert run(device, high_entropy(rho=0.2), batch).weights.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]
    # All equal: the quantile is that value, every token is kept and the advantages pass unchanged.
    equal = fields([[0.7, 0.7, 0.7]], advantages=[[1.0, -2.0, 3.0]])
    assert torch.equal(run(device, high_entropy(rho=0.2), equal).advantages, equal["advantages"])


def test_high_entropy_ignores_masked_positions_and_all_masked_rows(device):
    # Row 1 is all padding (entropy 9 there must not raise the quantile); row 0 alone: q_0.5 of 0.2, 0.4, 0.6 = 0.4.
    batch = fields([[0.2, 0.4, 0.6, 9.0], [9.0, 9.0, 9.0, 9.0]], advantages=[[1, 1, 1, 1], [1, 1, 1, 1]],
                   mask=[[1, 1, 1, 0], [0, 0, 0, 0]])
    output = run(device, high_entropy(rho=0.5), batch)
    assert output.weights.tolist() == [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    # Masked positions pass through untouched (as for AR).
    assert output.advantages.tolist() == [[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    assert torch.equal(output.weights.bool(), trl_high_entropy_mask(batch["entropy"], batch["response_mask"], 0.5))


def test_high_entropy_with_no_valid_token_gives_zero_weights_and_no_nan(device):
    batch = fields([[0.3, 0.2]], mask=[[0, 0]])
    for normalize in ("none", "mean"):
        weights = run(device, high_entropy(rho=0.2, normalize=normalize), batch).weights
        assert weights.tolist() == [[0.0, 0.0]]


def test_high_entropy_mean_normalised_divides_by_the_kept_share(device):
    # 2 of 5 valid tokens kept: weight 5/2 on each, mean 1 over valid tokens.
    batch = fields([[0.1, 0.2, 0.3, 0.8, 0.9]])
    weights = run(device, high_entropy(rho=0.4, normalize="mean"), batch).weights
    assert_close(weights, [[0.0, 0.0, 0.0, 2.5, 2.5]])


@pytest.mark.parametrize("seed", range(5))
def test_high_entropy_matches_trl_on_random_batches(device, seed):
    generator = torch.Generator().manual_seed(seed)
    entropy = torch.rand(6, 11, generator=generator) * 3
    entropy[0, :3] = entropy[1, 4]  # ties
    mask = torch.rand(6, 11, generator=generator) > 0.3
    batch = {"entropy": entropy, "old_log_probs": torch.zeros(6, 11), "response_mask": mask,
             "advantages": torch.randn(6, 11, generator=generator)}
    for rho in (0.2, 0.5, 1.0):
        weights = run(device, high_entropy(rho=rho), batch).weights
        assert torch.equal(weights.bool(), trl_high_entropy_mask(entropy, mask, 1.0 - rho)), rho


def test_masked_quantile_equals_torch_quantile(device):
    generator = torch.Generator().manual_seed(3)
    values = torch.rand(7, 9, generator=generator).to(device)
    mask = (torch.rand(7, 9, generator=generator) > 0.4).to(device)
    for q in (0.0, 0.05, 0.5, 0.8, 1.0):
        assert float(masked_quantile_tensor(values, mask, q)) == float(torch.quantile(values[mask], q))
    assert float(masked_quantile_tensor(values, torch.zeros_like(mask), 0.5)) == 0.0


# --- STAPO -------------------------------------------------------------------------------------------------------
def test_stapo_silences_only_positive_improbable_confident_tokens_by_hand(device):
    # (A, pi, H) per token; entropy_quantile 0.5 of 0.01, 2.0, 0.01, 0.01, 1.0, 3.0 at rank 2.5 -> tau_h = 0.505.
    # Spurious: token 0 only (A > 0, pi 0.005 < 0.01, H 0.01 < 0.505). Token 1: high entropy; token 2: A < 0;
    # token 3: probable; 4 and 5: high entropy. 5 of 6 kept: weights 6/5.
    batch = fields([[0.01, 2.0, 0.01, 0.01, 1.0, 3.0]], probs=[[0.005, 0.005, 0.005, 0.5, 0.005, 0.5]],
                   advantages=[[1.0, 1.0, -1.0, 1.0, 1.0, 1.0]])
    output = run(device, stapo(tau_p=0.01, entropy_quantile=0.5), batch)
    assert_close(output.weights, [[0.0, 1.2, 1.2, 1.2, 1.2, 1.2]])
    assert_close(output.advantages, [[0.0, 1.2, -1.2, 1.2, 1.2, 1.2]])
    assert output.metrics[keys.KEPT_TOKEN_FRAC] == pytest.approx(5 / 6)


def test_stapo_comparisons_are_strict_at_the_entropy_quantile(device):
    # entropy_quantile 0: tau_h is the minimum entropy, and H < min holds for no token: nothing is silenced and the
    # weights are exactly 1 (the advantages unchanged bit for bit).
    batch = fields([[0.01, 0.01, 0.5]], probs=[[0.001, 0.001, 0.001]], advantages=[[1.0, 2.0, 3.0]])
    output = run(device, stapo(tau_p=0.01, entropy_quantile=0.0), batch)
    assert torch.equal(output.advantages, batch["advantages"])
    # tau_p 0: pi < 0 never holds.
    assert torch.equal(run(device, stapo(tau_p=0.0, entropy_quantile=1.0), batch).advantages, batch["advantages"])


def test_stapo_ignores_padding_and_empty_batches(device):
    # Row 1 is padding with spurious-looking values: never silenced, never in the quantile, passed through.
    batch = fields([[0.01, 1.0, 2.0], [0.0, 0.0, 0.0]], probs=[[0.001, 0.5, 0.5], [0.001] * 3],
                   advantages=[[1.0, 1.0, 1.0], [4.0, 4.0, 4.0]], mask=[[1, 1, 1], [0, 0, 0]])
    output = run(device, stapo(tau_p=0.01, entropy_quantile=0.5), batch)  # tau_h = 1.0: token (0, 0) silenced
    assert_close(output.weights, [[0.0, 1.5, 1.5], [0.0, 0.0, 0.0]])
    assert output.advantages[1].tolist() == [4.0, 4.0, 4.0]
    empty = fields([[0.01, 0.02]], mask=[[0, 0]])
    assert run(device, stapo(), empty).weights.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("seed", range(5))
def test_stapo_matches_the_paper_rule_on_random_batches(device, seed):
    generator = torch.Generator().manual_seed(seed)
    shape = (8, 12)
    mask = torch.rand(shape, generator=generator) > 0.2
    probs = torch.rand(shape, generator=generator) ** 4
    entropy = torch.rand(shape, generator=generator) * 2
    advantages = torch.randn(shape, generator=generator)
    batch = {"entropy": entropy, "old_log_probs": probs.log(), "response_mask": mask, "advantages": advantages}
    tau_p, quantile = 0.05, 0.3
    tau_h = torch.quantile(entropy[mask], quantile)
    spurious = mask & (advantages > 0) & (probs.log().exp() < tau_p) & (entropy < tau_h)
    kept = mask & ~spurious
    expected = torch.where(kept, advantages * mask.sum() / kept.sum(), torch.where(mask, 0.0, advantages))
    output = run(device, stapo(tau_p=tau_p, entropy_quantile=quantile), batch)
    assert int(spurious.sum()) > 0  # the case is not vacuous
    torch.testing.assert_close(output.advantages, expected)


def test_mean_normalize_of_all_zero_weights_is_zero_not_nan():
    mask = torch.tensor([[True, True, False]])
    assert masked_mean_normalize(torch.zeros(1, 3), mask).tolist() == [[0.0, 0.0, 0.0]]


# --- the paper code's sigmoid weights ---------------------------------------------------------------------------
def paper_both_sigmoid(advantage, log_prob, reweight_k, reweight_tau):
    """``compute_reweight_advantage``'s ``both_sigmoid`` branch (without ``balance1``), restated."""
    return 2 * torch.sigmoid(reweight_k * (torch.exp(log_prob) - reweight_tau)) * advantage


def test_sigmoid_weights_by_hand_and_against_the_paper_code(device):
    # pi = 0.25, 0.5, 1.0; k = 4, tau = 0.5: 2 sigmoid(-1) = 2 / (1 + e), 2 sigmoid(0) = 1, 2 sigmoid(2).
    batch = fields([[0.0, 0.0, 0.0]], probs=[[0.25, 0.5, 1.0]], advantages=[[1.0, -2.0, 3.0]])
    output = run(device, sigmoid(k=4.0, tau=0.5, normalize="none"), batch)
    expected = [2 / (1 + math.e), 1.0, 2 / (1 + math.exp(-2))]
    assert_close(output.weights, [expected])
    torch.testing.assert_close(output.advantages, paper_both_sigmoid(batch["advantages"], batch["old_log_probs"],
                                                                     4.0, 0.5))
    normalised = run(device, sigmoid(k=4.0, tau=0.5), batch).weights
    assert_close(normalised, [[value / (sum(expected) / 3) for value in expected]])


@pytest.mark.parametrize("normalize", ["mean", "none"])
def test_sigmoid_with_k_zero_is_the_baseline_bit_for_bit(device, normalize):
    generator = torch.Generator().manual_seed(1)
    advantages = torch.randn(4, 6, generator=generator)
    batch = {"old_log_probs": -torch.rand(4, 6, generator=generator) * 4, "advantages": advantages,
             "response_mask": torch.rand(4, 6, generator=generator) > 0.3}
    assert torch.equal(run(device, sigmoid(k=0.0, normalize=normalize), batch).advantages, advantages)


# --- the entropy scorer and the parameters -----------------------------------------------------------------------
def test_entropy_rules_need_the_entropy_field_and_refuse_non_finite_entropy(device):
    batch = fields([[0.1, float("nan")]], mask=[[1, 0]])  # NaN at a masked position: fine
    run(device, high_entropy(), batch)
    with pytest.raises(KeyError, match="entropy"):
        high_entropy().process(1, {name: value for name, value in batch.items() if name != "entropy"})
    bad = fields([[0.1, float("inf"), float("nan")]])
    with pytest.raises(ValueError, match=r"'entropy' has 2 NaN or infinite value\(s\) on valid tokens.*\(0, 1\)"):
        run(device, stapo(), bad)


def test_entropy_scorer_clamps_rounding_below_zero():
    batch = fields([[-1e-7, 0.5]])
    histograms = high_entropy(rho=1.0).process(1, batch, histograms=True).histograms
    assert histograms[keys.HIST_ENTROPY].counts[0] == 1 and histograms[keys.HIST_ENTROPY].counts.sum() == 2


def test_entropy_histogram_only_for_mechanisms_that_read_entropy():
    batch = fields([[0.1, 0.5]])
    assert keys.HIST_ENTROPY in high_entropy().process(1, batch, histograms=True).histograms
    assert keys.HIST_ENTROPY not in sigmoid().process(1, batch, histograms=True).histograms


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (block("entropy", "entropy_quantile", rho=0.0), r"rho = 0.0 is not allowed: it must be in \(0, 1\]"),
        (block("entropy", "entropy_quantile", rho=1.5), r"params\.rho = 1.5 is not allowed: it must be in \[0, 1\]"),
        (block("entropy", "entropy_quantile", normalize="sum"), r"normalize = 'sum' is not allowed.*'mean', 'none'"),
        (block("entropy", "stapo", tau_p=-0.1), r"params\.tau_p = -0.1 is not allowed"),
        (block("entropy", "stapo", entropy_quantile="low"), r"params\.entropy_quantile = 'low' is not allowed"),
        (block("entropy", "stapo", alpha=0.5), r"alpha.*allowed.*tau_p"),
        (block("token_prob", "sigmoid_reweight", k=-1.0), r"params\.k = -1.0 is not allowed: it must be >= 0"),
        (block("token_prob", "sigmoid_reweight", tau=2.0), r"params\.tau = 2.0 is not allowed"),
        (block("token_prob", "entropy_quantile"), r"'token_prob' signal.*consumes only \['entropy'\]"),
        (block("entropy", "advantage_reweight"), r"'entropy' signal.*consumes only \['token_prob'\]"),
    ],
)
def test_bad_rule_parameters_are_refused_naming_key_value_and_allowed(config, message):
    with pytest.raises(ConfigError, match=message):
        build_mechanism(config)


@pytest.mark.parametrize(("scorer", "actuator", "params"), [
    ("entropy", "entropy_quantile", {"rho": 0.2}),
    ("entropy", "stapo", {"tau_p": 0.3, "entropy_quantile": 0.5}),
    ("token_prob", "sigmoid_reweight", {"k": 4.0}),
])
def test_each_rule_fuses_under_torch_compile_with_the_eager_result(scorer, actuator, params):
    generator = torch.Generator().manual_seed(0)
    batch = {"old_log_probs": -torch.rand(16, 20, generator=generator) * 3,
             "response_mask": (torch.rand(16, 20, generator=generator) > 0.2).float(),
             "advantages": torch.randn(16, 20, generator=generator),
             "entropy": torch.rand(16, 20, generator=generator)}
    config = block(scorer, actuator, **params)
    eager = build_mechanism(config).process(1, batch)
    compiled = build_mechanism(config, compile=True).process(1, batch)
    torch.testing.assert_close(compiled.advantages, eager.advantages)
    assert compiled.metrics[keys.KEPT_TOKEN_FRAC] == eager.metrics[keys.KEPT_TOKEN_FRAC]
    assert not torch.equal(eager.advantages, batch["advantages"])  # the rule changed something
