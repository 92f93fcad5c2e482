"""A KV-cached sampling loop drawing HF ``generate``'s samples for the same seed (top_k=0, top_p=1)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from dataflex_rl.tinylm.decoder import DecoderWeights, attention_bias, distinct_prompts, padded_length

COMPACT_FRACTION = 0.75  # drop finished rows from the cache once at most this share of its rows is still active


class Sampled(NamedTuple):
    """``responses (N, R)``; with a temperature, sampled tokens' ``log_probs`` and ``entropy`` (greedy: None)."""

    responses: torch.Tensor
    log_probs: torch.Tensor | None
    entropy: torch.Tensor | None


def token_log_prob_and_entropy(scores: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_softmax = F.log_softmax(scores, dim=-1)
    entropy = torch.special.entr(log_softmax.exp()).sum(-1)  # entr(0) = 0: a -inf score adds nothing, not NaN
    return log_softmax.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), entropy


@torch.no_grad()
def sample(weights: DecoderWeights, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
           temperature: float | None, eos_token_id: int, pad_token_id: int,
           row_generators: list[torch.Generator] | None = None) -> Sampled:
    """:class:`Sampled` responses for left-padded prompts ``(N, P)``; ``temperature=None`` is greedy."""
    rows, prompt_length = prompt_ids.shape
    total = padded_length(prompt_length + max_new_tokens)  # columns past the end stay masked
    layers = len(weights.layers)
    cache_k = torch.zeros(layers, rows, weights.num_kv_heads, total, weights.head_dim)
    cache_v = torch.zeros_like(cache_k)
    key_valid = torch.zeros(rows, total, dtype=torch.bool)
    key_valid[:, :prompt_length] = prompt_mask.bool()
    logits = _prefill(weights, prompt_ids, prompt_mask, cache_k, cache_v)
    positions = prompt_mask.long().sum(-1)  # the next token's position: attended tokens so far
    active = torch.arange(rows)  # cache row i holds sequence active[i]
    responses, log_probs, entropies = [], [], []
    finished = torch.zeros(rows, dtype=torch.bool)
    vocab = logits.shape[-1]
    for step in range(max_new_tokens):
        scores = torch.zeros(rows, vocab)
        scores[:, pad_token_id] = 1.0  # finished rows: any fixed distribution (their draw is discarded)
        scores[active] = logits / temperature if temperature else logits
        if temperature:
            tokens = _draw(F.softmax(scores, dim=-1), row_generators)
            token_log_probs, entropy = token_log_prob_and_entropy(scores, tokens)
            log_probs.append(torch.where(finished, 0.0, token_log_probs))
            entropies.append(torch.where(finished, 0.0, entropy))
        else:
            tokens = scores.argmax(-1)
        tokens = torch.where(finished, pad_token_id, tokens)
        responses.append(tokens)
        finished = finished | (tokens == eos_token_id)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        column = prompt_length + step
        key_valid[:, column] = True
        still = ~finished[active]
        if int(still.sum()) <= COMPACT_FRACTION * len(active):
            active, cache_k, cache_v = active[still], cache_k[:, still], cache_v[:, still]
        logits = _decode(weights, tokens[active], positions[active] + step, cache_k, cache_v, column,
                         key_valid[active])
    if not temperature:
        return Sampled(torch.stack(responses, dim=1), None, None)
    return Sampled(*(torch.stack(values, dim=1) for values in (responses, log_probs, entropies)))


def _draw(probabilities: torch.Tensor, row_generators: list[torch.Generator] | None) -> torch.Tensor:
    if row_generators is None:
        return torch.multinomial(probabilities, num_samples=1).squeeze(1)
    return torch.cat([torch.multinomial(row, num_samples=1, generator=generator)
                      for row, generator in zip(probabilities, row_generators, strict=True)])


def _prefill(weights: DecoderWeights, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
             cache_k: torch.Tensor, cache_v: torch.Tensor) -> torch.Tensor:
    first, inverse = distinct_prompts(prompt_ids)
    prompt_ids, prompt_mask = prompt_ids[first], prompt_mask[first]
    prompts, length = prompt_ids.shape
    keys = padded_length(length)  # attention over a padded key length, masked past the prompt
    valid = F.pad(prompt_mask.bool(), (0, keys - length))
    positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    cos, sin = weights.rope(positions)
    x = weights.model.model.embed_tokens(prompt_ids)
    causal = torch.ones(length, keys, dtype=torch.bool).tril()
    bias = attention_bias((causal & valid.unsqueeze(1)) | torch.eye(length, keys, dtype=torch.bool)).unsqueeze(1)
    for index, layer in enumerate(weights.layers):
        q, k, v = weights.qkv(layer, x, cos, sin)  # (U, L, heads, d)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        cache_k[index, :, :, :length] = k[inverse]
        cache_v[index, :, :, :length] = v[inverse]
        padding = (0, 0, 0, keys - length)
        attended = weights.attend(q.transpose(1, 2).contiguous(), F.pad(k, padding), F.pad(v, padding), bias)
        x = weights.finish_layer(layer, x, attended.transpose(1, 2).reshape(prompts, length, -1))
    return weights.logits(x[:, -1])[inverse]


def _decode(weights: DecoderWeights, tokens: torch.Tensor, positions: torch.Tensor, cache_k: torch.Tensor,
            cache_v: torch.Tensor, column: int, key_valid: torch.Tensor) -> torch.Tensor:
    cos, sin = weights.rope(positions)
    x = weights.model.model.embed_tokens(tokens)
    bias = attention_bias(key_valid)[:, None, None, :]
    for index, layer in enumerate(weights.layers):
        q, k, v = weights.qkv(layer, x, cos, sin)  # (n, heads, d)
        cache_k[index, :, :, column] = k
        cache_v[index, :, :, column] = v
        attended = weights.attend(q.unsqueeze(2), cache_k[index], cache_v[index], bias)
        x = weights.finish_layer(layer, x, attended.reshape(len(tokens), -1))
    return weights.logits(x)
