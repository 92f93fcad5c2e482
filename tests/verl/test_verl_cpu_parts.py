"""The pieces of verl's CPU mode on their own: platform, rollout sampling and seeds, weight digests, tokenizer."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import torch

from dataflex_rl.run_config import ModelConfig
from dataflex_rl.tinylm.decoder import DecoderWeights
from dataflex_rl.tinylm.model import build_model
from dataflex_rl.tinylm.sampler import sample
from dataflex_rl.tinylm.sequences import encode_prompts
from dataflex_rl.verl.cpu import CPUModeError, check_platform_selected
from dataflex_rl.verl.cpu.platform import CPU_DEVICE_MODULE, PlatformCPU
from dataflex_rl.verl.cpu.prepare import hf_char_tokenizer
from dataflex_rl.verl.cpu.rollout import check_sampling, request_seed, weights_digest

ALPHABET = "0123456789+=;"


@pytest.fixture(scope="module")
def tiny():
    return build_model(ModelConfig(architecture="llama", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                   intermediate_size=64, max_position_embeddings=64), ALPHABET, seed=3)


def test_platform_answers_what_verl_asks_without_an_accelerator():
    platform = PlatformCPU()
    assert platform.device_name == "cpu"
    assert platform.current_device() == "cpu"  # verl writes .to(get_device_id()); an int would mean cuda:N
    assert torch.zeros(2).to(platform.current_device()).device.type == "cpu"
    assert platform.communication_backend_name() == "gloo"
    assert platform.ray_resource_name() == "GPU"
    assert platform.is_platform_available(use_smi_check=True) is False  # never auto-detected on a GPU machine
    free, total = CPU_DEVICE_MODULE.mem_get_info()
    assert 0 < free <= total
    assert CPU_DEVICE_MODULE.empty_cache() is None and CPU_DEVICE_MODULE.memory_allocated() == 0


def test_the_plugin_refuses_to_load_without_verl_platform_cpu(monkeypatch):
    monkeypatch.setenv("VERL_PLATFORM", "nvidia")
    with pytest.raises(CPUModeError, match=r"VERL_PLATFORM = 'nvidia' is not allowed"):
        check_platform_selected()


def test_a_row_samples_the_same_tokens_alone_or_in_any_batch(tiny):
    """The rollout server batches requests as they arrive: with one generator per row, a row's sample depends on
    its own seed only."""
    model, tokenizer = tiny
    prompts = ["12+7=", "3+45=", "999+1=", "5+5="]
    seeds = [11, 22, 33, 44]

    def draw(indices):
        ids, mask = encode_prompts(tokenizer, [prompts[i] for i in indices])
        generators = [torch.Generator().manual_seed(seeds[i]) for i in indices]
        responses, log_probs, _ = sample(DecoderWeights(model), ids, mask, 6, 1.0, tokenizer.eos_token_id,
                                      tokenizer.pad_token_id, row_generators=generators)
        drawn = {}
        for row, i in enumerate(indices):  # up to the first <eos> (the batch's loop may run longer)
            tokens = responses[row].tolist()
            end = tokens.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in tokens else len(tokens)
            drawn[i] = (responses[row, :end], log_probs[row, :end])
        return drawn

    together = draw([0, 1, 2, 3])
    for indices in ([2], [3, 0], [1, 3, 2]):
        for index, (tokens, log_probs) in draw(indices).items():
            assert torch.equal(tokens, together[index][0])
            torch.testing.assert_close(log_probs, together[index][1])
    assert not all(torch.equal(together[0][0], together[i][0]) for i in (1, 2, 3))


def test_request_seeds_separate_versions_prompts_and_occurrences():
    base = request_seed(1, 0, [1, 5, 6], 0)
    assert base == request_seed(1, 0, [1, 5, 6], 0)
    others = {request_seed(2, 0, [1, 5, 6], 0), request_seed(1, 1, [1, 5, 6], 0), request_seed(1, 0, [1, 5, 7], 0),
              request_seed(1, 0, [1, 5, 6], 1)}
    assert base not in others and len(others) == 4
    assert all(0 <= seed < 2**63 for seed in others)


@pytest.mark.parametrize("key, value", [("top_k", 5), ("top_p", 0.9), ("repetition_penalty", 1.1)])
def test_sampling_the_sampler_does_not_implement_is_refused_by_name(key, value):
    check_sampling({"temperature": 1.0, "top_k": -1, "top_p": 1.0, "repetition_penalty": 1.0})
    with pytest.raises(ValueError, match=rf"actor_rollout_ref.rollout.{key} = {value} is not allowed"):
        check_sampling({"temperature": 1.0, key: value})


def test_weights_digest_sees_a_one_ulp_change_and_ignores_order(tiny):
    model, _ = tiny
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    digest = weights_digest(state.items())
    assert digest == weights_digest(reversed(list(state.items())))
    name = next(iter(state))
    state[name].view(-1)[0] = torch.nextafter(state[name].view(-1)[0], torch.tensor(float("inf")))
    assert weights_digest(state.items()) != digest


def test_the_hf_tokenizer_has_the_character_tokenizer_ids_and_renders_the_local_prompt(tiny):
    _, char_tokenizer = tiny
    tokenizer = hf_char_tokenizer(char_tokenizer)
    rng = random.Random(0)
    for _ in range(20):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12)))
        assert tokenizer.encode(text, add_special_tokens=False) == char_tokenizer.encode(text)
        ids, _ = encode_prompts(char_tokenizer, [text])
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True)
        rendered = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
        assert list(rendered) == ids[0].tolist()  # <bos> + the prompt, as the local backend encodes it
        assert tokenizer.decode(char_tokenizer.encode(text) + [char_tokenizer.eos_token_id],
                                skip_special_tokens=True) == text
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_prepare_writes_a_complete_folder_keeps_it_for_the_same_inputs_and_refuses_others(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dataflex_rl.verl.cpu.prepare import prepare

    overrides = ["model.architecture=llama", "sft.steps=0"]  # no SFT: the machinery only
    out = prepare(tmp_path / "prepared", overrides, train_size=16, test_size=8)
    assert AutoModelForCausalLM.from_pretrained(out / "model").config.model_type == "llama"
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False) == "<bos>1+2="
    train = pd.read_parquet(out / "data" / "train.parquet")
    test = pd.read_parquet(out / "data" / "test.parquet")
    assert (len(train), len(test)) == (16, 8)
    assert not set(train["extra_info"].map(lambda info: info["key"])) & set(test["extra_info"].map(lambda info: info["key"]))
    written = (out / "done.json").stat().st_mtime_ns
    assert prepare(out, overrides, train_size=16, test_size=8) == out
    assert (out / "done.json").stat().st_mtime_ns == written  # the same inputs: left as it is
    with pytest.raises(FileExistsError, match="prepared from other inputs"):
        prepare(out, overrides, train_size=32, test_size=8)
