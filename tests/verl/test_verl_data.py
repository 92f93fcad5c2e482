"""K&K parquet files for verl: the columns verl's RLHFDataset reads, and the reward verl loads for them."""

from __future__ import annotations

import inspect
import json

import pandas as pd
import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset

from dataflex_rl.tasks.knights_knaves import Puzzle, render_chat_completion, render_chat_messages
from dataflex_rl.verl.data import COLUMNS, TEST_FILE, TRAIN_FILE, build_rows, main

PEOPLE = (3, 5, 7)
TASK = ["--task", "knights_knaves"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("kk-verl")
    arguments = ["--out", str(out), *TASK, "num_people=[3,5,7]", "--train-size", str(8 * len(PEOPLE))]
    assert main([*arguments, "--test-size", str(4 * len(PEOPLE)), "--seed", "3"]) == 0
    return out


def read(data_dir, name) -> pd.DataFrame:
    return pd.read_parquet(data_dir / name)


def tiny_chat_tokenizer():
    """A whitespace word-level tokenizer with a chat template (no download): one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    tokenizer.chat_template = (
        "{% for message in messages %}<{{ message['role'] }}> {{ message['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


def dataset_config(verl_config, tmp_path, **changes):
    """verl's ``data`` config of the experiment, reading local files, caching into ``tmp_path``."""
    config = OmegaConf.to_container(verl_config.data, resolve=True)
    config.update({"cache_dir": str(tmp_path / "verl-cache"), "filter_overlong_prompts_workers": 1, **changes})
    return OmegaConf.create(config)


def test_files_have_verls_columns_and_the_difficulty_mix(data_dir):
    train, test = read(data_dir, TRAIN_FILE), read(data_dir, TEST_FILE)
    for frame in (train, test):
        assert tuple(frame.columns) == COLUMNS
        assert set(frame.data_source) == {"knights_knaves"}
        assert all(set(row) >= {"ground_truth", "style"} for row in frame.reward_model)
    assert len(train) == 8 * len(PEOPLE) and len(test) == 4 * len(PEOPLE)
    train_difficulties = [info["difficulty"] for info in train.extra_info]
    assert sorted(set(train_difficulties)) == list(PEOPLE)
    assert all(train_difficulties.count(people) == 8 for people in PEOPLE)
    # test rows interleave the difficulties, so every prefix mixes them
    assert [info["difficulty"] for info in test.extra_info][: len(PEOPLE)] == list(PEOPLE)
    assert [info["index"] for info in train.extra_info] == list(range(len(train)))
    assert {info["key"] for info in train.extra_info}.isdisjoint({info["key"] for info in test.extra_info})


def test_rows_are_reproducible_and_the_test_set_ignores_the_train_seed():
    first = build_rows("knights_knaves", {"num_people": [3, 4]}, 10, 6, seed=1)
    assert build_rows("knights_knaves", {"num_people": [3, 4]}, 10, 6, seed=1) == first
    other_seed = build_rows("knights_knaves", {"num_people": [3, 4]}, 10, 6, seed=2)
    assert other_seed["test"] == first["test"]
    assert other_seed["train"] != first["train"]


def test_prompt_is_the_chat_rendering_of_the_ground_truth_puzzle(data_dir):
    for row in read(data_dir, TRAIN_FILE).itertuples():
        puzzle = Puzzle.from_dict(json.loads(row.reward_model["ground_truth"]))
        assert [dict(message) for message in row.prompt] == render_chat_messages(puzzle)
        assert puzzle.num_people == row.extra_info["difficulty"]


def test_verls_dataset_reads_the_files(data_dir, verl_config, tmp_path):
    config = dataset_config(verl_config, tmp_path, filter_overlong_prompts=False)
    dataset = RLHFDataset(data_files=[str(data_dir / TEST_FILE)], tokenizer=None, config=config)
    assert len(dataset) == 4 * len(PEOPLE)
    item = dataset[1]
    puzzle = Puzzle.from_dict(json.loads(item["reward_model"]["ground_truth"]))
    assert item["raw_prompt"] == render_chat_messages(puzzle)
    assert item["data_source"] == "knights_knaves"
    assert item["index"] == 1 and item["extra_info"]["split"] == "test"


def test_verls_prompt_length_filter_reads_the_chat_messages(data_dir, verl_config, tmp_path):
    """The experiment filters overlong prompts through the tokenizer's chat template; a prompt that failed to
    render would count as too long, so keeping every row under a generous limit shows they all render."""
    tokenizer = tiny_chat_tokenizer()
    files = [str(data_dir / TRAIN_FILE)]
    kept_all = RLHFDataset(files, tokenizer, dataset_config(verl_config, tmp_path, max_prompt_length=100_000))
    assert len(kept_all) == 8 * len(PEOPLE)

    frame = read(data_dir, TRAIN_FILE)
    # One token per whitespace-separated word of the rendered template.
    rendered = [
        tokenizer.apply_chat_template([dict(message) for message in prompt], add_generation_prompt=True, tokenize=False)
        for prompt in frame.prompt
    ]
    lengths = [len(text.split()) for text in rendered]
    limit = sorted(lengths)[len(lengths) // 2]
    filtered = RLHFDataset(files, tokenizer, dataset_config(verl_config, tmp_path, max_prompt_length=limit))
    assert 0 < len(filtered) < len(frame)
    assert len(filtered) == sum(length <= limit for length in lengths)


def test_reward_function_loads_through_verls_loader_and_scores_answers(data_dir, verl_config):
    """``reward.custom_reward_function`` of the experiment, called as verl's reward manager calls it."""
    compute_score = get_custom_reward_fn(verl_config)
    assert compute_score is not None
    raw = compute_score.args[0]  # verl wraps the function in partial(_call_with_kwargs, function, reward_kwargs)
    inspect.signature(raw).bind(data_source="", solution_str="", ground_truth="", extra_info={})
    for row in read(data_dir, TEST_FILE).itertuples():
        ground_truth = row.reward_model["ground_truth"]
        puzzle = Puzzle.from_dict(json.loads(ground_truth))
        wrong = (not puzzle.solution[0], *puzzle.solution[1:])
        # verl's reward manager adds num_turns and rollout_reward_scores to extra_info before the call.
        extra_info = {**row.extra_info, "num_turns": 2, "rollout_reward_scores": {}}
        arguments = {"data_source": row.data_source, "ground_truth": ground_truth, "extra_info": extra_info}
        assert compute_score(solution_str=render_chat_completion(puzzle), **arguments)["score"] == 3.0  # format +1, answer +2
        assert compute_score(solution_str=render_chat_completion(puzzle, wrong), **arguments)["score"] == -0.5  # +1, -1.5
        assert compute_score(solution_str="the answer is obvious", **arguments)["score"] == -3.0  # no tags: -1, -2


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path), *TASK, "num_people=[1]"])
    assert exit_info.value.code == 2
    assert "num_people = 1 is not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *TASK, "--train-size", "-1"])
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_only_the_two_files_are_left(data_dir):
    assert sorted(path.name for path in data_dir.iterdir()) == sorted([TRAIN_FILE, TEST_FILE])
