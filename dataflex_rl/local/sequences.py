"""Batches of prompt + response token sequences, generation, and per-token log-probabilities.

Layout: prompts are left-padded to a common length ``P`` (so generation appends at the right), responses are
right-padded to ``R``; ``input_ids`` is ``(N, P + R)``. Every per-token tensor of the RL step is ``(N, R)`` over
response positions, with ``response_mask`` 1 on generated tokens up to and including the first ``<eos>``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from dataflex_rl.local.decoder import DecoderWeights, shared_prefix_forward
from dataflex_rl.local.sampler import Sampled, sample, token_log_prob_and_entropy
from dataflex_rl.local.tokenizer import Tokenizer


@dataclasses.dataclass
class SequenceBatch:
    """``input_ids``/``attention_mask``: ``(N, P + R)``; ``response_mask``: ``(N, R)``; ``prompt_length``: ``P``;
    ``group_index``: ``(N,)`` prompt index of each sequence (verl's ``uid``), for group-relative advantages;
    ``sampling_log_probs``: ``(N, R)`` log-probs of the sampled tokens from the sampler's own logits (with the
    temperature), when the batch was sampled; ``sampling_entropy``: ``(N, R)`` the entropy of each token's sampling
    distribution, likewise (0 at masked positions in both)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    prompt_length: int
    group_index: np.ndarray
    sampling_log_probs: torch.Tensor | None = None
    sampling_entropy: torch.Tensor | None = None

    @property
    def responses(self) -> torch.Tensor:
        """The response tokens ``(N, R)``: every column after the prompt."""
        return self.input_ids[:, self.prompt_length :]

    def select(self, rows: torch.Tensor | np.ndarray) -> SequenceBatch:
        """The batch restricted to ``rows`` (same prompt length)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        return SequenceBatch(
            self.input_ids[rows], self.attention_mask[rows], self.response_mask[rows], self.prompt_length,
            self.group_index[rows.numpy()],
            None if self.sampling_log_probs is None else self.sampling_log_probs[rows],
            None if self.sampling_entropy is None else self.sampling_entropy[rows],
        )


def encode_prompts(tokenizer: Tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, both ``(N, P)``: ``<bos>`` + prompt, left-padded with ``<pad>``."""
    encoded = [[tokenizer.bos_token_id, *tokenizer.encode(prompt)] for prompt in prompts]
    length = max(len(ids) for ids in encoded)
    ids = torch.full((len(encoded), length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), length), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, length - len(tokens) :] = torch.tensor(tokens)
        mask[row, length - len(tokens) :] = 1
    return ids, mask


def response_mask_from(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on response tokens up to and including the first ``<eos>`` (all of them when there is none)."""
    is_eos = responses == eos_token_id
    # Number of eos tokens strictly before each position; a position is valid while that count is 0.
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens, so left padding does not shift them (as HF ``generate`` does)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    prompts: list[str],
    repeats: int,
    max_new_tokens: int,
    temperature: float | None,
    sampler: str = "hf",
) -> SequenceBatch:
    """Sample ``repeats`` responses per prompt; ``temperature=None`` is greedy.

    ``sampler="cached"``: the project's KV-cached loop (:mod:`dataflex_rl.local.sampler`, same samples as HF for
    the same seed); ``"hf"``: HF ``generate``. The log-probs of the sampled tokens come from the scores the sampler
    computed anyway (logits divided by the temperature; no top-k/top-p), which equal a fresh forward pass of the
    same weights to float rounding.
    """
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    prompt_ids = prompt_ids.repeat_interleave(repeats, dim=0)
    prompt_mask = prompt_mask.repeat_interleave(repeats, dim=0)
    if sampler == "cached":
        sampled = sample(DecoderWeights(model), prompt_ids, prompt_mask, max_new_tokens, temperature,
                         tokenizer.eos_token_id, tokenizer.pad_token_id)
    else:
        sampled = hf_sample(model, prompt_ids, prompt_mask, max_new_tokens, temperature, tokenizer.eos_token_id,
                            tokenizer.pad_token_id)
    return _sequence_batch(prompt_ids, prompt_mask, sampled, tokenizer, len(prompts), repeats)


@torch.no_grad()
def hf_sample(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
              temperature: float | None, eos_token_id: int, pad_token_id: int) -> Sampled:
    """HF ``generate``'s :class:`~dataflex_rl.local.sampler.Sampled` for left-padded prompts, with the same
    contract as :func:`dataflex_rl.local.sampler.sample` (softmax(logits / T) or greedy; torch's global RNG)."""
    # An explicit config: a checkpoint's own generation defaults (repetition penalty, top-p, ...) would make the
    # samples and their scores follow another distribution than the softmax(logits / T) the loss uses.
    generation_config = GenerationConfig(
        do_sample=bool(temperature),
        temperature=temperature if temperature else None,
        top_k=0 if temperature else None,
        top_p=1.0 if temperature else None,
        repetition_penalty=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        use_cache=True,
        output_scores=bool(temperature),
        return_dict_in_generate=True,
    )
    output = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config)
    responses = output.sequences[:, prompt_ids.shape[1]:]
    if not temperature:
        return Sampled(responses, None, None)
    scores = torch.stack(output.scores, dim=1).float()  # (N, R, vocab), already divided by the temperature
    return Sampled(responses, *token_log_prob_and_entropy(scores, responses))


def _sequence_batch(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampled: Sampled, tokenizer: Tokenizer,
                    prompts: int, repeats: int) -> SequenceBatch:
    responses = sampled.responses
    response_mask = response_mask_from(responses, tokenizer.eos_token_id)
    # where, not a product: a pad position after <eos> may score -inf (its entropy NaN), and -inf * 0 is NaN.
    sampling_log_probs, sampling_entropy = (
        None if values is None else torch.where(response_mask.bool(), values, 0.0)
        for values in (sampled.log_probs, sampled.entropy))
    return SequenceBatch(
        input_ids=torch.cat([prompt_ids, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
        response_mask=response_mask,
        prompt_length=prompt_ids.shape[1],
        group_index=np.repeat(np.arange(prompts), repeats),
        sampling_log_probs=sampling_log_probs,
        sampling_entropy=sampling_entropy,
    )


def decode_responses(tokenizer: Tokenizer, batch: SequenceBatch) -> list[str]:
    """Each row's response as text (the tokenizer stops at the first EOS)."""
    return [tokenizer.decode(row.tolist()) for row in batch.responses]


@dataclasses.dataclass
class TokenOutputs:
    """Per response token, ``(N, R)``: ``log_probs`` of the sampled token, ``entropy`` of the distribution,
    ``logit_grad_factor`` = ``sqrt((1 - p_y)^2 + sum_{j != y} p_j^2)``, the norm of ``d(-log p_y)/d logits``
    (``None`` unless asked for)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor
    logit_grad_factor: torch.Tensor | None = None


def response_token_outputs(
    model: torch.nn.Module, batch: SequenceBatch, temperature: float, with_grad_factor: bool = False,
    packed: bool = False, compiled: bool = False,
) -> TokenOutputs:
    """Log-probs (with grad when enabled), entropy and optionally the logit-gradient factor of response tokens.

    Logits are divided by the sampling temperature before the softmax, as verl's actor does. ``packed=True``
    (a model :func:`~dataflex_rl.local.decoder.supported` covers) computes only valid positions, each distinct
    prompt once: every output is 0 where ``response_mask`` is 0; ``False`` runs the HF forward over the padded
    batch. ``compiled`` fuses the packed path's per-layer elementwise work with ``torch.compile``.
    """
    if packed:
        return _packed_token_outputs(model, batch, temperature, with_grad_factor, compiled)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids(batch.attention_mask),
        use_cache=False,
    ).logits
    # The token at position t is predicted by the logits at t - 1.
    logits = logits[:, batch.prompt_length - 1 : -1].float() / temperature
    log_softmax = F.log_softmax(logits, dim=-1)
    targets = batch.responses.unsqueeze(-1)
    log_probs = log_softmax.gather(-1, targets).squeeze(-1)
    entropy, factor = _entropy_and_factor(log_softmax, targets, with_grad_factor)
    return TokenOutputs(log_probs=log_probs, entropy=entropy, logit_grad_factor=factor)


def _packed_token_outputs(model: torch.nn.Module, batch: SequenceBatch, temperature: float,
                          with_grad_factor: bool, compiled: bool = False) -> TokenOutputs:
    """:func:`response_token_outputs` over valid positions only (:func:`shared_prefix_forward`: each distinct
    prompt once, no padding, no row's last token); the LM head runs on the positions that predict a response
    token."""
    response_mask = batch.response_mask.bool()
    rows, length = response_mask.shape
    last_valid = response_mask.long().sum(-1) - 1
    keep = response_mask & (torch.arange(length) != last_valid.unsqueeze(-1))
    weights = DecoderWeights(model, compiled=compiled)
    prompt_length = batch.prompt_length
    forward = shared_prefix_forward(weights, batch.input_ids[:, :prompt_length],
                                    batch.attention_mask[:, :prompt_length], batch.responses, keep)
    split = len(forward.prompt_index)
    prompt_slot = torch.full(((int(forward.inverse.max()) + 1) * forward.prompt_length,), -1, dtype=torch.long)
    prompt_slot[forward.prompt_index] = torch.arange(split)
    response_slot = torch.full((rows * forward.response_length,), -1, dtype=torch.long)
    response_slot[forward.response_index] = torch.arange(split, len(forward.hidden))
    target_rows, target_columns = response_mask.nonzero(as_tuple=True)
    # Response token r is predicted by the hidden state before it: the prompt's last token for r = 0, else the
    # response token r - 1.
    from_prompt = prompt_slot[forward.inverse[target_rows] * forward.prompt_length + prompt_length - 1]
    from_response = response_slot[target_rows * forward.response_length + (target_columns - 1).clamp(min=0)]
    predictors = torch.where(target_columns == 0, from_prompt, from_response)
    logits = weights.logits(forward.hidden.index_select(0, predictors)).float() / temperature
    log_softmax = F.log_softmax(logits, dim=-1)
    targets = batch.responses[target_rows, target_columns].unsqueeze(-1)
    entropy, factor = _entropy_and_factor(log_softmax, targets, with_grad_factor)
    where = (target_rows, target_columns)

    def scatter(values: torch.Tensor | None) -> torch.Tensor | None:
        return None if values is None else values.new_zeros((rows, length)).index_put(where, values)

    return TokenOutputs(log_probs=scatter(log_softmax.gather(-1, targets).squeeze(-1)), entropy=scatter(entropy),
                        logit_grad_factor=scatter(factor))


def _entropy_and_factor(log_softmax: torch.Tensor, targets: torch.Tensor, with_grad_factor: bool):
    """Entropy of each distribution and (optionally) the logit-gradient factor of its target, without grad."""
    with torch.no_grad():
        probs = log_softmax.exp()
        entropy = -(probs * log_softmax).sum(-1)
        factor = None
        if with_grad_factor:
            sampled = probs.gather(-1, targets).squeeze(-1)
            squares = (probs * probs).sum(-1)
            # |e_y - p|^2 = (1 - p_y)^2 + sum_{j != y} p_j^2 = 1 - 2 p_y + sum_j p_j^2
            factor = (1.0 - 2.0 * sampled + squares).clamp(min=0.0).sqrt()
    return entropy, factor
