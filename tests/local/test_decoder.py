"""The project's decoder against HF: same samples as ``generate`` for the same seed, same per-token outputs and
gradients as the HF forward over the padded batch, and the fallback for models it does not cover."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from dataflex_rl.run_config import ModelConfig, TrainerConfig
from dataflex_rl.tinylm.decoder import supported
from dataflex_rl.tinylm.model import build_model
from dataflex_rl.tinylm.sequences import generate, response_token_outputs
from dataflex_rl.local.trainer import fast_paths
from dataflex_rl.tasks import build_task
from dataflex_rl.validation import ConfigError

# Prompts of different lengths, so the batch is left-padded; 1-digit and 3-digit operands.
PROMPTS = ["1+2=", "345+67=", "9+988=", "12+3=", "0+0=", "501+499="]


def tiny(architecture: str) -> tuple[torch.nn.Module, object]:
    task = build_task("arithmetic", {})
    config = ModelConfig(architecture=architecture, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64)
    model, tokenizer = build_model(config, task.alphabet, seed=3)
    return model.eval(), tokenizer


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7, None])
def test_cached_sampler_draws_the_samples_hf_generate_draws(architecture, temperature):
    model, tokenizer = tiny(architecture)
    batches, next_draws = {}, {}
    for sampler in ("hf", "cached"):
        torch.manual_seed(11)
        batches[sampler] = generate(model, tokenizer, PROMPTS, 8, 12, temperature, sampler=sampler)
        next_draws[sampler] = torch.rand(3)  # the random stream was consumed identically
    hf, cached = batches["hf"], batches["cached"]
    assert torch.equal(hf.input_ids, cached.input_ids)
    assert torch.equal(hf.attention_mask, cached.attention_mask)
    assert torch.equal(hf.response_mask, cached.response_mask)
    assert torch.equal(next_draws["hf"], next_draws["cached"])
    lengths = hf.response_mask.sum(-1)
    if temperature:
        # Rows end at different steps (the loop drops finished rows from its cache) and some run to the limit.
        assert lengths.min() < lengths.max() == 12
        torch.testing.assert_close(cached.sampling_log_probs, hf.sampling_log_probs, atol=2e-5, rtol=0)
        torch.testing.assert_close(cached.sampling_entropy, hf.sampling_entropy, atol=2e-5, rtol=0)
    else:
        assert cached.sampling_log_probs is None and cached.sampling_entropy is None


@pytest.mark.parametrize("sampler", ["hf", "cached"])
def test_sampling_entropy_is_the_old_policy_entropy_a_forward_pass_gives(sampler):
    """The entropy the entropy scorer reads on the local backend (from the sampler's logits) equals the entropy
    of the same weights' forward pass (what ``trainer.recompute_old_log_probs`` and verl compute), 0 at padding."""
    model, tokenizer = tiny("qwen2")
    torch.manual_seed(2)
    batch = generate(model, tokenizer, PROMPTS, 4, 10, 0.7, sampler=sampler)
    mask = batch.response_mask.bool()
    recomputed = response_token_outputs(model, batch, 0.7).entropy
    torch.testing.assert_close(batch.sampling_entropy[mask], recomputed[mask], atol=2e-5, rtol=0)
    assert (batch.sampling_entropy[~mask] == 0).all() and (~mask).any()
    assert float(batch.sampling_entropy[mask].min()) > 0.0


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_packed_forward_gives_hf_outputs_and_gradients(architecture):
    model, tokenizer = tiny(architecture)
    torch.manual_seed(5)
    batch = generate(model, tokenizer, PROMPTS, 4, 10, 1.0, sampler="hf")
    mask = batch.response_mask.bool()
    assert (~mask).any() and (batch.attention_mask[:, : batch.prompt_length] == 0).any()  # padding on both sides
    outputs, gradients = {}, {}
    for packed in (False, True):
        model.zero_grad()
        outputs[packed] = response_token_outputs(model, batch, 0.9, with_grad_factor=True, packed=packed)
        (outputs[packed].log_probs * mask * torch.linspace(-1, 1, mask.shape[1])).sum().backward()
        gradients[packed] = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    for field in ("log_probs", "entropy", "logit_grad_factor"):
        plain, packed = getattr(outputs[False], field), getattr(outputs[True], field)
        torch.testing.assert_close(packed[mask], plain[mask], atol=1e-5, rtol=1e-5)
        assert (packed[~mask] == 0).all()  # padded positions are never computed
    assert gradients[True].keys() == gradients[False].keys()
    for name, gradient in gradients[False].items():
        torch.testing.assert_close(gradients[True][name], gradient, atol=1e-5, rtol=1e-4, msg=name)


def test_models_the_decoder_does_not_cover_keep_the_hf_paths():
    model, _ = tiny("qwen2")
    assert supported(model) is None
    assert fast_paths(model, TrainerConfig()) == ("cached", True)
    assert fast_paths(model, TrainerConfig(sampler="hf", pack=False)) == ("hf", False)
    config = Qwen2Config(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                         max_window_layers=0)
    windowed = Qwen2ForCausalLM(config)
    assert "sliding" in supported(windowed)
    assert fast_paths(windowed, TrainerConfig()) == ("hf", False)


def test_an_unknown_sampler_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"sampler = 'vllm'.*cached.*hf"):
        TrainerConfig(sampler="vllm")


@pytest.mark.slow
def test_compiled_packed_forward_matches_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model, tokenizer = tiny("qwen2")
    torch.manual_seed(5)
    batch = generate(model, tokenizer, PROMPTS, 4, 10, 1.0)
    mask = batch.response_mask.bool()
    eager = response_token_outputs(model, batch, 1.0, packed=True)
    compiled = response_token_outputs(model, batch, 1.0, packed=True, compiled=True)
    torch.testing.assert_close(compiled.log_probs[mask], eager.log_probs[mask], atol=1e-5, rtol=1e-5)
    compiled.log_probs.sum().backward()  # the compiled backward runs
    assert all(p.grad is not None for p in model.model.layers[0].parameters())


def build_trainer(overrides: list[str]):
    from dataflex_rl import build_mechanism
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tinylm.sft import warm_start
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers

    from .conftest import compose_train

    resolved = compose_train(overrides)
    config = parse_train_config(resolved)
    task = build_task(config.task.name, config.task.params)
    model, tokenizer, _ = warm_start(config.model, config.task, config.sft, task)
    identity = RunIdentity.for_config(resolved, sweep="t", run="t", backend="local", mechanism="reweight",
                                      alpha=0.5, seed=config.seed)
    loggers = build_loggers(config.logger, RunStore(config.run_dir), identity, resolved)
    trainer = GRPOTrainer(config, task, model, tokenizer, build_mechanism(config.dataflex), loggers,
                          f"{config.run_dir}/checkpoints")
    return trainer, loggers


def test_fast_paths_train_as_the_hf_paths_do(tmp_path, sft_cache):
    from dataflex_rl import keys

    from .conftest import tiny_overrides

    steps = {}
    for name, switches in {"hf": ["trainer.sampler=hf", "trainer.pack=false"], "fast": []}.items():
        trainer, loggers = build_trainer(tiny_overrides(tmp_path / name, sft_cache) + switches
                                         + ["trainer.prompts_per_step=8"])
        assert (trainer.sampler, trainer.pack) == (("hf", False) if switches else ("cached", True))
        with loggers:
            steps[name] = [trainer.train_step(step) for step in (1, 2)]
            steps[name].append({"weights": torch.cat([p.detach().flatten() for p in trainer.model.parameters()])})
    for hf, fast in zip(steps["hf"][:-1], steps["fast"][:-1]):
        # The same samples (so the same rewards and lengths) and the same update, to float rounding.
        for key in (keys.SCORE_MEAN, keys.RESPONSE_LENGTH_MEAN, keys.TRAIN_ACCURACY):
            assert fast[key] == hf[key], key
        for key in (keys.PG_LOSS, keys.GRAD_NORM, keys.ENTROPY):
            assert fast[key] == pytest.approx(hf[key], rel=1e-4, abs=1e-6), key
    assert steps["hf"][0][keys.GRAD_NORM] > 0  # the updates did something
    torch.testing.assert_close(steps["fast"][-1]["weights"], steps["hf"][-1]["weights"], atol=1e-5, rtol=1e-4)
