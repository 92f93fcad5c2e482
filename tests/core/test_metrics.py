"""Hand-derived values for the statistics helpers (histograms, quantiles, probability buckets)."""

import re

import numpy as np
import pytest
import torch

from dataflex_rl import ConfigError, keys
from dataflex_rl.metrics import (
    bucket_edges, histogram_counts, prob_bucket_stats, read_on_host, sample_quantile_tensor,
    sample_quantiles,
)


def test_histogram_fixed_edges_with_overflow_into_end_bins(device):
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    values = torch.tensor([-5.0, 0.5, 1.0, 2.5, 3.0, 99.0], device=device)
    # [-5 -> first bin], [0.5 -> 0], [1.0 -> 1], [2.5 -> 2], [3.0 -> last], [99 -> last]
    assert histogram_counts(values, torch.ones_like(values, dtype=torch.bool), edges).cpu().tolist() == [2, 1, 3]


def test_sample_quantiles_lower_definition(device):
    values = torch.arange(1.0, 11.0, device=device).reshape(2, 5)  # 1..10
    mask = torch.ones(2, 5, dtype=torch.bool, device=device)
    # k = floor(q (n - 1)) + 1 with n = 10: q=.05 -> 1st, q=.5 -> 5th, q=.95 -> 9th smallest
    assert sample_quantiles(values, mask) == [1.0, 5.0, 9.0]
    mask[1] = False  # 1..5 only: 1st, 3rd, 4th smallest
    assert sample_quantiles(values, mask) == [1.0, 3.0, 4.0]
    # Without a host read: the same values and the sample's valid-token count, on the device.
    assert sample_quantile_tensor(values, mask).device == values.device
    assert sample_quantile_tensor(values, mask).tolist() == [1.0, 3.0, 4.0, 5.0]
    assert sample_quantile_tensor(values, torch.zeros_like(mask)).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_masked_histogram_counts_and_one_host_read(device):
    # Valid: 0.5 -> bin 0, 2.5 and 7.0 -> bin 2 (overflow); masked: -1 and 1.5 count nowhere.
    values = torch.tensor([[0.5, -1.0, 2.5], [1.5, 7.0, 0.0]], device=device)
    mask = torch.tensor([[True, False, True], [False, True, False]], device=device)
    counts = histogram_counts(values, mask, np.array([0.0, 1.0, 2.0, 3.0]))
    assert counts.device == values.device and counts.cpu().tolist() == [1, 0, 2]
    parts = {"counts": counts, "scalar": values.sum(), "empty": values[:0, 0]}
    assert read_on_host(parts) == {"counts": [1.0, 0.0, 2.0], "scalar": [10.5], "empty": []}


def test_bucket_edges_cover_unit_interval_and_refuse_bad_edges():
    assert [label for _, _, label in bucket_edges((0.5,))] == ["0.00-0.50", "0.50-1.00"]
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        bucket_edges((0.0, 0.5))
    with pytest.raises(ValueError, match="distinct"):
        bucket_edges((0.5, 0.5))


def test_prob_bucket_stats_hand_derived(device):
    # Four valid tokens and one masked: pi = 0.1, 0.3, 0.6, 1.0 (| masked 0.2), |A w| = 2, 1, 1, 4.
    probs = torch.tensor([[0.1, 0.3, 0.6, 1.0, 0.2]])
    weighted = torch.tensor([[-2.0, 1.0, 1.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    norms = torch.tensor([[3.0, 1.0, 0.0, 0.0, 50.0]])
    probs, weighted, mask, norms = (tensor.to(device) for tensor in (probs, weighted, mask, norms))
    stats = prob_bucket_stats(probs, weighted, mask, edges=(0.5,), per_token_grad_norms={"logit_grad_norm": norms})
    low, high = "0.00-0.50", "0.50-1.00"
    assert stats[keys.grad_by_prob(low, "token_share")] == 0.5
    assert stats[keys.grad_by_prob(high, "token_share")] == 0.5
    assert stats[keys.grad_by_prob(low, "adv_weight_abs_mean")] == pytest.approx(1.5)  # (2 + 1) / 2
    assert stats[keys.grad_by_prob(high, "adv_weight_abs_mean")] == pytest.approx(2.5)  # (1 + 4) / 2, pi=1 included
    # bound |A w| (1 - pi): low (2*0.9 + 1*0.7)/2 = 1.25; high (1*0.4 + 4*0)/2 = 0.2
    assert stats[keys.grad_by_prob(low, "logit_grad_bound")] == pytest.approx(1.25)
    assert stats[keys.grad_by_prob(high, "logit_grad_bound")] == pytest.approx(0.2)
    assert stats[keys.grad_by_prob(low, "logit_grad_norm")] == pytest.approx(4.0)
    assert stats[keys.grad_by_prob(low, "logit_grad_norm_share")] == pytest.approx(1.0)
    assert stats[keys.GRAD_LOW_PROB_SHARE] == pytest.approx(1.0)
    # Without per-token norms the low-probability share comes from the bound: 2.5 / (2.5 + 0.4)
    stats = prob_bucket_stats(probs, weighted, mask, edges=(0.5,))
    assert stats[keys.GRAD_LOW_PROB_SHARE] == pytest.approx(2.5 / 2.9)


def test_prob_bucket_stats_empty_batch_is_all_zero(device):
    ones = torch.ones(1, 2, device=device)
    stats = prob_bucket_stats(ones, ones, torch.zeros(1, 2, device=device), edges=(0.5,))
    assert all(value == 0.0 for value in stats.values())


@pytest.mark.parametrize("value", ["baseline", "dataflex.actuator.params.alpha", "sft.seed", "val/acc", 3])
def test_the_metric_check_accepts_metric_names_only(value):
    """Config keys and preset names are not metrics: ``plan_metric=baseline`` is refused naming key, value, allowed."""
    with pytest.raises(ConfigError, match=rf"^plan_metric = {re.escape(repr(value))} is not allowed: not a metric the "
                                          rf"trainer logs.*; allowed: .*val/accuracy, .*grad_norm/by_prob/<bucket>"):
        keys.check_metric_key("plan_metric", value)
    for metric in ("val/accuracy", "actor/stage1/pg_loss", keys.grad_by_prob("0.00-0.25", "token_share")):
        assert keys.check_metric_key("plan_metric", metric) == metric
