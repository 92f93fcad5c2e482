"""The decoder's forward pass written for this workload, over the HF model's own parameters.

Two uses, both over the weights of a Qwen2/Llama ``*ForCausalLM`` (gradients flow into them as usual):

- :func:`packed_forward`: the full-sequence forward pass with no work on padded positions. Every valid token of
  the batch is packed into one ``(T, hidden)`` matrix for the linear layers (where nearly all the FLOPs are); only
  attention scatters to the padded ``(N, L)`` layout, where it is cheap at these lengths. Tokens whose output
  nothing reads (each row's last valid token) are left out too.
- :class:`DecoderWeights.step`: one position of every sequence against a key/value cache, for the KV-cached
  sampler (:mod:`dataflex_rl.local.sampler`).

The math is HF's (RMSNorm, rotary embedding with ``rotate_half``, grouped-query attention, SwiGLU MLP); a test
checks the logits against the HF forward. :func:`supported` says which checkpoints it covers; anything else keeps
the HF code paths.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass
class DecoderWeights:
    """A view of a supported model's parameters (no copies: the optimiser updates them in place)."""

    model: torch.nn.Module

    def __post_init__(self) -> None:
        config = self.model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.hidden_size = config.hidden_size
        body = self.model.model
        self.layers = list(body.layers)
        self.inv_freq = body.rotary_emb.inv_freq
        self.rope_scaling = float(body.rotary_emb.attention_scaling)

    @property
    def eps(self) -> float:
        return self.layers[0].input_layernorm.variance_epsilon

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)``, each ``positions.shape + (head_dim,)``, as HF's rotary embedding computes them."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling

    def qkv(self, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated queries ``(..., heads, d)``, rotated keys and values ``(..., kv_heads, d)`` of ``x (..., hidden)``."""
        attention = layer.self_attn
        h = _rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
        shape = x.shape[:-1]
        q = F.linear(h, attention.q_proj.weight, attention.q_proj.bias).view(*shape, self.num_heads, self.head_dim)
        k = F.linear(h, attention.k_proj.weight, attention.k_proj.bias).view(*shape, self.num_kv_heads, self.head_dim)
        v = F.linear(h, attention.v_proj.weight, attention.v_proj.bias).view(*shape, self.num_kv_heads, self.head_dim)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def finish_layer(self, layer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual stream after the attention output ``attended (..., heads * d)`` and the MLP."""
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
        """``(N, heads, Lq, d)`` attention of contiguous queries over keys/values ``(N, kv_heads, Lk, d)``; ``bias``
        ``(N, 1, Lq, Lk)`` is added to the scores (0 where a query may attend, -inf elsewhere).

        Plain batched matmuls rather than ``scaled_dot_product_attention``: at these lengths (N=256, L=16, d=32,
        forward and backward, one thread) its CPU kernel took about twice as long. Grouped-query attention as HF's
        ``repeat_kv``: query head ``h`` reads key/value head ``h // groups``, so each key/value head's ``groups``
        query heads are folded into its query length instead of copying keys and values.
        """
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
    """Additive scores bias from a boolean "may attend" mask: 0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def padded_length(length: int) -> int:
    """``length`` rounded up to a multiple of 16: the CPU softmax over a row of 15 costs ~10x a row of 16."""
    return -(-length // 16) * 16


@dataclasses.dataclass
class PackedHidden:
    """Final hidden states (after the last norm's input, i.e. before ``norm``/``lm_head``) of the packed tokens.

    ``hidden``: ``(T, hidden)``; ``flat_index``: ``(T,)`` the position ``row * length + column`` of each packed
    token, ``length`` being the batch's length rounded up by :func:`padded_length`.
    """

    hidden: torch.Tensor
    flat_index: torch.Tensor
    length: int


def packed_forward(weights: DecoderWeights, input_ids: torch.Tensor, keep: torch.Tensor,
                   attention_mask: torch.Tensor) -> PackedHidden:
    """Forward pass over the tokens where ``keep (N, L)`` is True, every other position costing nothing.

    Returns the final hidden states before the last norm (see :meth:`DecoderWeights.logits`).
    ``attention_mask (N, L)`` marks the tokens that exist (left padding is 0); positions count attended tokens
    only, as HF ``generate`` does. ``keep`` must be a subset of the attention mask that holds every key the kept
    queries attend to (causal: all valid tokens before a kept one).
    """
    rows, length = input_ids.shape
    flat_index = keep.reshape(-1).nonzero().squeeze(-1)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).reshape(-1)[flat_index]
    cos, sin = weights.rope(positions)
    x = weights.model.model.embed_tokens(input_ids.reshape(-1)[flat_index])
    # Attention runs on the padded layout, its length rounded up (see padded_length); the packed tokens' places
    # in it are ``row * padded + column``.
    padded = padded_length(length)
    keep = F.pad(keep, (0, padded - length))
    flat_index = keep.reshape(-1).nonzero().squeeze(-1)
    # Queries may attend to kept keys at or before them; a padded query attends to itself only (never a fully
    # masked row, whose softmax would be NaN and leak into the backward pass).
    causal = torch.ones(padded, padded, dtype=torch.bool).tril()
    bias = attention_bias((causal & keep.unsqueeze(1)) | torch.eye(padded, dtype=torch.bool)).unsqueeze(1)
    for layer in weights.layers:
        q, k, v = weights.qkv(layer, x, cos, sin)
        attended = weights.attend(*(_unpack(t, flat_index, rows, padded) for t in (q, k, v)), bias)
        attended = attended.transpose(1, 2).reshape(rows * padded, -1).index_select(0, flat_index)
        x = weights.finish_layer(layer, x, attended)
    return PackedHidden(hidden=x, flat_index=flat_index, length=padded)


def _unpack(packed: torch.Tensor, flat_index: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """``(T, heads, d)`` -> ``(N, heads, L, d)`` with zeros at the positions left out."""
    full = packed.new_zeros((rows * length, *packed.shape[1:])).index_copy(0, flat_index, packed)
    return full.view(rows, length, *packed.shape[1:]).transpose(1, 2).contiguous()
