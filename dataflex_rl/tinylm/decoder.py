"""The packed forward pass over a Qwen2/Llama HF model's own parameters (docs/performance.md)."""

from __future__ import annotations

import dataclasses
import functools
import os
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

_CLASSES = ("Qwen2ForCausalLM", "LlamaForCausalLM")


def supported(model: torch.nn.Module) -> str | None:
    """``None`` when the fast forward covers ``model`` exactly; otherwise the reason it does not."""
    name = type(model).__name__
    if name not in _CLASSES:
        return f"architecture {name} (covered: {', '.join(_CLASSES)})"
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope_type {rope.get('rope_type')!r}"
    if any(kind != "full_attention" for kind in (getattr(config, "layer_types", None) or [])):
        return "sliding-window attention layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # HF's RMSNorm: x / sqrt(mean(x^2) + eps) * weight (float32 throughout here).
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) over the two halves of the head dimension.
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


COMPILE_CACHE_DIR = ".cache/torch_compile"  # inductor's persistent cache (TORCHINDUCTOR_CACHE_DIR wins if set)


@functools.cache
def compiled_methods() -> dict[str, Callable]:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(COMPILE_CACHE_DIR).resolve()))
    return {name: torch.compile(getattr(DecoderWeights, name), dynamic=True) for name in ("qkv", "finish_layer")}


@dataclasses.dataclass
class DecoderWeights:
    """A view of a supported model's parameters (no copies: the optimiser updates them in place)."""

    model: torch.nn.Module
    compiled: bool = False

    def __post_init__(self) -> None:
        if self.compiled:
            for name, function in compiled_methods().items():
                setattr(self, name, types.MethodType(function, self))
        config = self.model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        body = self.model.model
        self.layers = list(body.layers)
        self.inv_freq = body.rotary_emb.inv_freq
        self.rope_scaling = float(body.rotary_emb.attention_scaling)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling

    def qkv(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        attention = layer.self_attn
        h = _rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        shape = x.shape[:-1]
        q = F.linear(h, attention.q_proj.weight, attention.q_proj.bias).view(*shape, self.num_heads, self.head_dim)
        k = F.linear(h, attention.k_proj.weight, attention.k_proj.bias).view(*shape, self.num_kv_heads, self.head_dim)
        v = F.linear(h, attention.v_proj.weight, attention.v_proj.bias).view(*shape, self.num_kv_heads, self.head_dim)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish_layer(self, layer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + F.linear(attended, layer.self_attn.o_proj.weight, layer.self_attn.o_proj.bias)
        mlp = layer.mlp
        h = _rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
        return x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                            mlp.down_proj.weight)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.model.model.norm
        return F.linear(_rms_norm(x, norm.weight, norm.variance_epsilon), self.model.lm_head.weight,
                        self.model.lm_head.bias)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # Batched matmuls (SDPA's CPU kernel was 2x slower here); GQA folds query heads into the query length.
        rows, heads, query_length, head_dim = q.shape
        kv_heads, key_length = k.shape[1], k.shape[2]
        groups = heads // kv_heads
        bias = bias.unsqueeze(2).expand(rows, kv_heads, groups, query_length, key_length)
        scores = torch.baddbmm(bias.reshape(rows * kv_heads, groups * query_length, key_length),
                               q.reshape(rows * kv_heads, groups * query_length, head_dim),
                               k.reshape(rows * kv_heads, key_length, head_dim).transpose(1, 2),
                               alpha=head_dim ** -0.5)
        attended = torch.bmm(scores.softmax(-1), v.reshape(rows * kv_heads, key_length, head_dim))
        return attended.view(rows, heads, query_length, head_dim)


def attention_bias(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def padded_length(length: int) -> int:
    """``length`` rounded up to a multiple of 16: the CPU softmax over a row of 15 costs ~10x a row of 16."""
    return -(-length // 16) * 16


@dataclasses.dataclass
class SharedPrefixHidden:
    """Final hidden states ``(T, hidden)``: distinct prompts' packed tokens, then the kept response tokens."""

    hidden: torch.Tensor
    prompt_index: torch.Tensor
    response_index: torch.Tensor
    inverse: torch.Tensor
    prompt_length: int
    response_length: int


def distinct_prompts(prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first row of each distinct prompt (U,), inverse (N,))``: rows of a GRPO group share one prompt."""
    _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    first = torch.empty(int(inverse.max()) + 1, dtype=torch.long).scatter_(0, inverse.flip(0),
                                                                          torch.arange(len(inverse)).flip(0))
    return first, inverse


def shared_prefix_forward(weights: DecoderWeights, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          response_ids: torch.Tensor, response_keep: torch.Tensor) -> SharedPrefixHidden:
    """Forward pass over each distinct prompt once and the kept response tokens ``(N, R)``; exact."""
    first, inverse = distinct_prompts(prompt_ids)
    prompt_ids, prompt_mask = prompt_ids[first], prompt_mask[first].bool()
    (rows, queries), (prompts, prompt_queries) = response_ids.shape, prompt_ids.shape
    # Key lengths are rounded up (see padded_length): the prompt's alone, and prompt + response together.
    prompt_length = padded_length(prompt_queries)
    response_length = padded_length(prompt_length + queries) - prompt_length
    prompt_keep = F.pad(prompt_mask, (0, prompt_length - prompt_mask.shape[1]))
    response_keep = F.pad(response_keep.bool(), (0, response_length - response_keep.shape[1]))
    prompt_index = prompt_keep.reshape(-1).nonzero().squeeze(-1)
    response_index = response_keep.reshape(-1).nonzero().squeeze(-1)
    prompt_positions = (prompt_keep.long().cumsum(-1) - 1).clamp(min=0).reshape(-1)[prompt_index]
    response_positions = (prompt_mask.sum(-1)[inverse].unsqueeze(-1) + torch.arange(response_length))
    positions = torch.cat([prompt_positions, response_positions.reshape(-1)[response_index]])
    ids = torch.cat([F.pad(prompt_ids, (0, prompt_length - prompt_ids.shape[1])).reshape(-1)[prompt_index],
                     F.pad(response_ids, (0, response_length - response_ids.shape[1])).reshape(-1)[response_index]])
    cos, sin = weights.rope(positions)
    x = weights.model.model.embed_tokens(ids)
    split = len(prompt_index)
    # A prompt query with no valid key attends to itself: a fully masked row's softmax would be NaN.
    prompt_causal = torch.ones(prompt_queries, prompt_length, dtype=torch.bool).tril() & prompt_keep.unsqueeze(1)
    prompt_bias = attention_bias(prompt_causal | torch.eye(prompt_queries, prompt_length, dtype=torch.bool))
    response_causal = (torch.ones(queries, response_length, dtype=torch.bool).tril()
                       & response_keep.unsqueeze(1))
    response_bias = attention_bias(torch.cat([prompt_keep[inverse].unsqueeze(1).expand(-1, queries, -1),
                                              response_causal], dim=-1))
    for layer in weights.layers:
        q, k, v = weights.qkv(layer, x, cos, sin)
        prompt_q, prompt_k, prompt_v = (_unpack(t[:split], prompt_index, prompts, prompt_length) for t in (q, k, v))
        response_q, response_k, response_v = (_unpack(t[split:], response_index, rows, response_length)
                                              for t in (q, k, v))
        # Only real query positions are computed; keys keep the rounded-up length.
        prompt_out = weights.attend(prompt_q[:, :, :prompt_queries].contiguous(), prompt_k, prompt_v,
                                    prompt_bias.unsqueeze(1))
        response_out = weights.attend(response_q[:, :, :queries].contiguous(),
                                      torch.cat([prompt_k[inverse], response_k], dim=2),
                                      torch.cat([prompt_v[inverse], response_v], dim=2), response_bias.unsqueeze(1))
        attended = torch.cat([_pack(prompt_out, prompt_index, prompt_length),
                              _pack(response_out, response_index, response_length)])
        x = weights.finish_layer(layer, x, attended)
    return SharedPrefixHidden(hidden=x, prompt_index=prompt_index, response_index=response_index, inverse=inverse,
                              prompt_length=prompt_length, response_length=response_length)


def _unpack(packed: torch.Tensor, flat_index: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    full = packed.new_zeros((rows * length, *packed.shape[1:])).index_copy(0, flat_index, packed)
    return full.view(rows, length, *packed.shape[1:]).transpose(1, 2).contiguous()


def _pack(padded: torch.Tensor, flat_index: torch.Tensor, length: int) -> torch.Tensor:
    rows, heads, queries, head_dim = padded.shape
    padded = F.pad(padded, (0, 0, 0, length - queries))
    return padded.transpose(1, 2).reshape(rows * length, heads * head_dim).index_select(0, flat_index)
