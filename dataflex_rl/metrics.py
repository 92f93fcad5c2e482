"""Mechanism statistics over valid tokens: scalar summaries, fixed-edge histograms, probability buckets, from
``(bs, L)`` tensors and a boolean ``response_mask`` to plain floats or numpy arrays any logger takes."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

import dataflex_rl.keys as keys

# Fixed edges, so histograms of different runs and steps are comparable bin for bin.
TOKEN_PROB_EDGES = np.linspace(0.0, 1.0, 51)
# Mean-normalised weights are mostly in [0, 2]; the last bin counts everything above its lower edge.
WEIGHT_EDGES = np.linspace(0.0, 4.0, 81)
# Token entropies in nats: a small vocabulary stays under 4, an LLM's mostly under 8; the last bin absorbs the rest.
ENTROPY_EDGES = np.linspace(0.0, 8.0, 81)
DEFAULT_BUCKET_EDGES = (0.25, 0.5, 0.75)
HISTOGRAM_EDGES = {keys.HIST_ENTROPY: ENTROPY_EDGES, keys.HIST_TOKEN_PROB: TOKEN_PROB_EDGES,
                   keys.HIST_WEIGHT: WEIGHT_EDGES}
LOW_PROB_THRESHOLD = 0.5


class Histogram(NamedTuple):
    """``counts[i]`` values fell in ``[edges[i], edges[i+1])`` (the last bin is closed and absorbs overflow)."""

    edges: np.ndarray  # (k + 1,) float64
    counts: np.ndarray  # (k,) int64


# Inner edges per (edges, device, dtype), copied to the device once per process (a host copy waits for it).
_INNER_EDGES: dict[tuple[bytes, torch.device, torch.dtype], torch.Tensor] = {}


def histogram_counts(values: torch.Tensor, mask: torch.Tensor, edges: np.ndarray) -> torch.Tensor:
    """``(k,)`` int64 counts of ``values[mask]`` on ``edges`` (outliers in the end bins), without a host sync."""
    key = (np.asarray(edges).tobytes(), values.device, values.dtype)
    if key not in _INNER_EDGES:
        _INNER_EDGES[key] = torch.as_tensor(np.asarray(edges)[1:-1], dtype=values.dtype, device=values.device)
    bins = len(edges) - 1
    index = torch.where(mask, torch.bucketize(values, _INNER_EDGES[key], right=True), bins).reshape(-1)
    counts = torch.zeros(bins + 1, dtype=torch.int64, device=values.device)
    return counts.index_add_(0, index, torch.ones_like(index))[:bins]


def read_on_host(parts: Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
    """Every tensor of ``parts`` as a flat list of floats, in one host synchronisation (counts exact to 2**53)."""
    flat = [part.reshape(-1).double() for part in parts.values()]
    values = iter(torch.cat(flat).tolist() if flat else [])
    return {name: list(itertools.islice(values, part.numel())) for name, part in zip(parts, flat)}


QUANTILES = (0.05, 0.5, 0.95)
QUANTILE_SAMPLE = 16384


class TokenStats(NamedTuple):
    """Over valid tokens: the sum and max of ``log pi``, their count, the sum of ``pi``, the count with pi < 0.5."""

    log_prob_sum: float
    log_prob_max: float
    count: float
    prob_sum: float
    low_count: float


class WeightStats(NamedTuple):
    """Over valid tokens: the sum of the weights and of their squares, their min and max, the count above 0."""

    total: float
    square_total: float
    minimum: float
    maximum: float
    kept: float


def token_stats(masked_log_probs: torch.Tensor, token_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """:class:`TokenStats` as a float64 ``(5,)`` tensor on the batch's device (no host sync)."""
    if masked_log_probs.numel() == 0:
        return torch.zeros(5, dtype=torch.float64, device=masked_log_probs.device)
    count = response_mask.sum()
    return torch.stack(
        [
            masked_log_probs.sum(),
            masked_log_probs.max(),
            count,
            # pi - 1 is exactly 0 at masked positions: sums valid tokens without cancellation.
            (token_probs - 1.0).sum() + count,
            (token_probs < LOW_PROB_THRESHOLD).sum(),
        ]
    ).double()


def weight_stats(weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """:class:`WeightStats` as a float64 ``(5,)`` tensor on the batch's device (no host sync)."""
    if weights.numel() == 0:
        return torch.zeros(5, dtype=torch.float64, device=weights.device)
    return torch.stack(
        [
            weights.sum(),
            (weights * weights).sum(),
            torch.where(response_mask, weights, float("inf")).min(),
            weights.max(),
            (weights > 0).sum().to(weights.dtype),  # masked positions hold 0: valid tokens only
        ]
    ).double()


def token_prob_metrics(stats: TokenStats) -> dict[str, float]:
    """``dataflex/valid_tokens``, ``dataflex/token_prob/{mean,low_frac}``."""
    metrics = {keys.VALID_TOKENS: stats.count}
    if stats.count:
        metrics[keys.TOKEN_PROB_MEAN] = stats.prob_sum / stats.count
        metrics[keys.TOKEN_PROB_LOW_FRAC] = stats.low_count / stats.count
    return metrics


def weight_metrics(stats: WeightStats, count: float, quantiles: list[float]) -> dict[str, float]:
    """``dataflex/weight/*`` (population std) and ``dataflex/kept_token_frac``."""
    if not count:
        return {}
    mean = stats.total / count
    variance = max(stats.square_total / count - mean * mean, 0.0)
    values = {"mean": mean, "std": variance**0.5, "min": stats.minimum, "max": stats.maximum}
    values.update({f"p{round(q * 100):02d}": value for q, value in zip(QUANTILES, quantiles)})
    result = {f"{keys.WEIGHT_PREFIX}/{name}": value for name, value in values.items()}
    result[keys.KEPT_TOKEN_FRAC] = stats.kept / count
    return result


def sample_quantiles(values: torch.Tensor, response_mask: torch.Tensor,
                     max_samples: int = QUANTILE_SAMPLE) -> list[float]:
    """:data:`QUANTILES` of ``values`` over valid tokens (``torch.quantile``'s "lower" definition)."""
    *quantiles, sampled = sample_quantile_tensor(values, response_mask, max_samples).tolist()
    if not sampled and bool(response_mask.any()):
        quantiles = sample_quantile_tensor(values, response_mask, values.numel()).tolist()[:-1]
    return quantiles


def sample_quantile_tensor(values: torch.Tensor, response_mask: torch.Tensor,
                           max_samples: int = QUANTILE_SAMPLE) -> torch.Tensor:
    """``[*quantiles, n]`` float64."""
    flat_values, flat_mask = values.reshape(-1), response_mask.reshape(-1)
    stride = max(1, -(-flat_values.numel() // max_samples))
    sample_mask = flat_mask[::stride]
    ordered = torch.where(sample_mask, flat_values[::stride].float(), float("inf")).sort().values
    count = sample_mask.sum().double()
    if ordered.numel() == 0:
        return torch.zeros(len(QUANTILES) + 1, dtype=torch.float64, device=values.device)
    # floor(q (n - 1)) in float64, as Python computes int(q * (n - 1)) on the host.
    ranks = torch.stack([((count - 1) * q).floor() for q in QUANTILES]).clamp(min=0).long()
    picked = torch.where(count > 0, ordered[ranks].double(), 0.0)
    return torch.cat([picked, count.reshape(1)])


def mechanism_histogram_counts(weights: torch.Tensor | None, token_probs: torch.Tensor | None,
                               response_mask: torch.Tensor,
                               entropy: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Counts of the weight, token-probability and entropy histograms given, on the batch's device."""
    return {name: histogram_counts(values.float(), response_mask, HISTOGRAM_EDGES[name])
            for name, values in ((keys.HIST_ENTROPY, entropy), (keys.HIST_TOKEN_PROB, token_probs),
                                 (keys.HIST_WEIGHT, weights)) if values is not None}


def histograms_from(counts: Mapping[str, Sequence[float]]) -> dict[str, Histogram]:
    """:class:`Histogram` per name from counts read on the host (names of :data:`HISTOGRAM_EDGES`)."""
    return {name: Histogram(edges=np.asarray(HISTOGRAM_EDGES[name], dtype=np.float64),
                            counts=np.asarray(values, dtype=np.float64).astype(np.int64))
            for name, values in counts.items()}


def bucket_edges(inner_edges: Sequence[float]) -> list[tuple[float, float, str]]:
    """``[(low, high, label), ...]`` covering [0, 1] from the inner edges, e.g. (0.25, 0.5, 0.75)."""
    inner = sorted(float(edge) for edge in inner_edges)
    if any(not 0.0 < edge < 1.0 for edge in inner) or len(set(inner)) != len(inner):
        raise ValueError(f"bucket edges must be distinct numbers strictly between 0 and 1, got {list(inner_edges)}")
    bounds = [0.0, *inner, 1.0]
    return [(low, high, keys.bucket_label(low, high)) for low, high in zip(bounds[:-1], bounds[1:])]


def bucket_masks(probs: torch.Tensor, inner_edges: Sequence[float]) -> list[tuple[str, torch.Tensor]]:
    """``(label, probs in the bucket)`` per bucket ``[low, high)`` of :func:`bucket_edges` (the last one closed)."""
    buckets = bucket_edges(inner_edges)
    return [(label, (probs >= low) & ((probs <= high) if index == len(buckets) - 1 else (probs < high)))
            for index, (low, high, label) in enumerate(buckets)]


def prob_bucket_stats(token_probs: torch.Tensor, weighted_advantages: torch.Tensor, response_mask: torch.Tensor,
                      edges: Sequence[float] = DEFAULT_BUCKET_EDGES,
                      per_token_grad_norms: Mapping[str, torch.Tensor] | None = None) -> dict[str, float]:
    """Gradient statistics by token-probability bucket ``[low, high)`` on ``pi`` (the paper's Fig. 1d)."""
    mask = response_mask.bool()
    probs = token_probs[mask].float()
    magnitude = weighted_advantages[mask].float().abs()
    total_tokens = probs.numel()
    norms = {"logit_grad_bound_sum": magnitude * (1.0 - probs),
             **{name: tensor[mask].float() for name, tensor in (per_token_grad_norms or {}).items()}}
    totals = {name: float(values.sum(dtype=torch.float64)) for name, values in norms.items()}
    stats: dict[str, float] = {}
    for label, in_bucket in bucket_masks(probs, edges):
        count = int(in_bucket.sum())
        stats[keys.grad_by_prob(label, "token_share")] = count / total_tokens if total_tokens else 0.0
        stats[keys.grad_by_prob(label, "adv_weight_abs_mean")] = (
            float(magnitude[in_bucket].mean(dtype=torch.float64)) if count else 0.0
        )
        bound = norms["logit_grad_bound_sum"][in_bucket]
        stats[keys.grad_by_prob(label, "logit_grad_bound")] = float(bound.mean(dtype=torch.float64)) if count else 0.0
        for name in per_token_grad_norms or {}:
            bucket_sum = float(norms[name][in_bucket].sum(dtype=torch.float64))
            stats[keys.grad_by_prob(label, name)] = bucket_sum
            stats[keys.grad_by_prob(label, f"{name}_share")] = bucket_sum / totals[name] if totals[name] else 0.0
    share_source = next(iter(per_token_grad_norms)) if per_token_grad_norms else "logit_grad_bound_sum"
    low = probs < LOW_PROB_THRESHOLD
    total = totals[share_source]
    stats[keys.GRAD_LOW_PROB_SHARE] = float(norms[share_source][low].sum(dtype=torch.float64)) / total if total else 0.0
    return stats


def prob_change_stats(old_log_probs: torch.Tensor, new_log_probs: torch.Tensor, advantages: torch.Tensor,
                      response_mask: torch.Tensor, edges: Sequence[float] = DEFAULT_BUCKET_EDGES) -> dict[str, float]:
    """How one update moved each token's ``pi`` (the AR paper's Fig. 2), by advantage sign x old-``pi`` bucket."""
    mask = response_mask.bool()
    old = old_log_probs[mask].double().exp()
    delta = new_log_probs[mask].double().exp() - old
    advantage = advantages[mask].double()
    total_tokens = old.numel()
    stats: dict[str, float] = {}
    correct_total, signed_total = 0, 0
    buckets = bucket_masks(old, edges)
    for sign, in_sign, right_way in (("pos", advantage > 0, delta > 0), ("neg", advantage < 0, delta < 0)):
        for label, in_bucket in buckets:
            cell = in_sign & in_bucket
            count = int(cell.sum())
            correct = int((cell & right_way).sum())
            stats[keys.prob_change(sign, label, "token_share")] = count / total_tokens if total_tokens else 0.0
            stats[keys.prob_change(sign, label, "mean_delta")] = float(delta[cell].mean()) if count else 0.0
            stats[keys.prob_change(sign, label, "correct_share")] = correct / count if count else 0.0
            correct_total += correct
            signed_total += count
    stats[keys.PROB_CHANGE_CORRECT_SHARE] = correct_total / signed_total if signed_total else 0.0
    return stats
