"""The policy model: a tiny HF causal LM built from the ``model`` block (``ModelConfig``), or a local HF checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dataflex_rl.tinylm.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

_ARCHITECTURES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


def build_model(config: Any, alphabet: str, seed: int) -> tuple[torch.nn.Module, Tokenizer]:
    """``(model, tokenizer)``: a random tiny LM over ``alphabet``, or the local checkpoint at ``config.path``."""
    if config.path is not None:
        return load_model(config.path)
    tokenizer = CharTokenizer(alphabet)
    config_class, model_class = _ARCHITECTURES[config.architecture]
    hf_config = config_class(
        vocab_size=tokenizer.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(hf_config)
    return model, tokenizer


def load_model(path: str | Path) -> tuple[torch.nn.Module, Tokenizer]:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model.path = {str(path)!r} is not a directory holding a Hugging Face checkpoint")
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    return model, load_tokenizer(path)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
