"""Batches of left-padded prompt + right-padded response sequences, generation, per-token log-probs."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from dataflex_rl.tinylm.decoder import DecoderWeights, shared_prefix_forward
from dataflex_rl.tinylm.sampler import Sampled, sample, token_log_prob_and_entropy
from dataflex_rl.tinylm.tokenizer import Tokenizer


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
        return self.input_ids[:, self.prompt_length :]

    def select(self, rows: torch.Tensor | np.ndarray) -> SequenceBatch:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return SequenceBatch(
            self.input_ids[rows], self.attention_mask[rows], self.response_mask[rows], self.prompt_length,
            self.group_index[rows.numpy()],
            None if self.sampling_log_probs is None else self.sampling_log_probs[rows],
            None if self.sampling_entropy is None else self.sampling_entropy[rows],
        )


def pad_rows(rows: list[list[int]], pad_token_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for index, row in enumerate(rows):
        columns = slice(length - len(row), length) if left else slice(0, len(row))
        ids[index, columns] = torch.tensor(row, dtype=torch.long)
        mask[index, columns] = 1
    return ids, mask


def encode_prompts(tokenizer: Tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_rows([[tokenizer.bos_token_id, *tokenizer.encode(prompt)] for prompt in prompts],
                    tokenizer.pad_token_id, left=True)


@torch.no_grad()
def generate(model: torch.nn.Module, tokenizer: Tokenizer, prompts: list[str], repeats: int, max_new_tokens: int,
             temperature: float | None, sampler: str = "hf") -> SequenceBatch:
    prompt_ids, prompt_mask = (rows.repeat_interleave(repeats, dim=0) for rows in encode_prompts(tokenizer, prompts))
    if sampler == "cached":
        sampled = sample(DecoderWeights(model), prompt_ids, prompt_mask, max_new_tokens, temperature,
                         tokenizer.eos_token_id, tokenizer.pad_token_id)
    else:
        sampled = hf_sample(model, prompt_ids, prompt_mask, max_new_tokens, temperature, tokenizer.eos_token_id,
                            tokenizer.pad_token_id)
    responses = sampled.responses
    is_eos = (responses == tokenizer.eos_token_id).long()
    # 1 up to and including the first <eos> (all of them when there is none): no eos strictly before the position.
    response_mask = (torch.cumsum(is_eos, dim=1) - is_eos == 0).long()
    # where, not a product: a pad position after <eos> may score -inf (its entropy NaN), and -inf * 0 is NaN.
    sampling_log_probs, sampling_entropy = (
        None if values is None else torch.where(response_mask.bool(), values, 0.0)
        for values in (sampled.log_probs, sampled.entropy))
    return SequenceBatch(
        input_ids=torch.cat([prompt_ids, responses], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask], dim=1),
        response_mask=response_mask,
        prompt_length=prompt_ids.shape[1],
        group_index=np.repeat(np.arange(len(prompts)), repeats),
        sampling_log_probs=sampling_log_probs,
        sampling_entropy=sampling_entropy,
    )


@torch.no_grad()
def hf_sample(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
              temperature: float | None, eos_token_id: int, pad_token_id: int) -> Sampled:
    """HF ``generate``'s :class:`~dataflex_rl.tinylm.sampler.Sampled`, without a checkpoint's generation defaults."""
    generation_config = GenerationConfig(
        do_sample=bool(temperature), temperature=temperature if temperature else None,
        top_k=0 if temperature else None, top_p=1.0 if temperature else None, repetition_penalty=1.0,
        max_new_tokens=max_new_tokens, pad_token_id=pad_token_id, eos_token_id=eos_token_id, use_cache=True,
        output_scores=bool(temperature), return_dict_in_generate=True)
    output = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config)
    responses = output.sequences[:, prompt_ids.shape[1]:]
    if not temperature:
        return Sampled(responses, None, None)
    scores = torch.stack(output.scores, dim=1).float()  # (N, R, vocab), already divided by the temperature
    return Sampled(responses, *token_log_prob_and_entropy(scores, responses))


def decode_responses(tokenizer: Tokenizer, batch: SequenceBatch) -> list[str]:
    return [tokenizer.decode(row.tolist()) for row in batch.responses]


@dataclasses.dataclass
class TokenOutputs:
    log_probs: torch.Tensor
    entropy: torch.Tensor
    logit_grad_factor: torch.Tensor | None = None


def response_token_outputs(
    model: torch.nn.Module, batch: SequenceBatch, temperature: float, with_grad_factor: bool = False,
    packed: bool = False, compiled: bool = False,
) -> TokenOutputs:
    if packed:
        return _packed_token_outputs(model, batch, temperature, with_grad_factor, compiled)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=(batch.attention_mask.cumsum(-1) - 1).clamp(min=0),  # left padding does not shift positions
        use_cache=False,
    ).logits
    logits = logits[:, batch.prompt_length - 1 : -1].float() / temperature
    return _token_outputs(F.log_softmax(logits, dim=-1), batch.responses.unsqueeze(-1), with_grad_factor)


def _packed_token_outputs(model: torch.nn.Module, batch: SequenceBatch, temperature: float,
                          with_grad_factor: bool, compiled: bool = False) -> TokenOutputs:
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
    # Response token r is predicted by the hidden state before it.
    from_prompt = prompt_slot[forward.inverse[target_rows] * forward.prompt_length + prompt_length - 1]
    from_response = response_slot[target_rows * forward.response_length + (target_columns - 1).clamp(min=0)]
    predictors = torch.where(target_columns == 0, from_prompt, from_response)
    logits = weights.logits(forward.hidden.index_select(0, predictors)).float() / temperature
    targets = batch.responses[target_rows, target_columns].unsqueeze(-1)
    outputs = _token_outputs(F.log_softmax(logits, dim=-1), targets, with_grad_factor)
    where = (target_rows, target_columns)
    return TokenOutputs(*(None if values is None else values.new_zeros((rows, length)).index_put(where, values)
                          for values in (outputs.log_probs, outputs.entropy, outputs.logit_grad_factor)))


def _token_outputs(log_softmax: torch.Tensor, targets: torch.Tensor, with_grad_factor: bool) -> TokenOutputs:
    log_probs = log_softmax.gather(-1, targets).squeeze(-1)
    with torch.no_grad():
        probs = log_softmax.exp()
        entropy = -(probs * log_softmax).sum(-1)
        factor = None
        if with_grad_factor:
            sampled = probs.gather(-1, targets).squeeze(-1)
            squares = (probs * probs).sum(-1)
            # |e_y - p|^2 = (1 - p_y)^2 + sum_{j != y} p_j^2 = 1 - 2 p_y + sum_j p_j^2
            factor = (1.0 - 2.0 * sampled + squares).clamp(min=0.0).sqrt()
    return TokenOutputs(log_probs=log_probs, entropy=entropy, logit_grad_factor=factor)
