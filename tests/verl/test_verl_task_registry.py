"""verl's reward function and data files serve any registered task through its verl hooks: a task defined here,
registered for the test only, is scored and written without any edit to ``dataflex_rl.verl.reward``/``.data``."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import pandas as pd
import pytest
from verl.trainer.ppo.reward import get_custom_reward_fn

from dataflex_rl.tasks import TASKS, Problem, Task
from dataflex_rl.validation import check_int_at_least
from dataflex_rl.verl import reward as reward_module
from dataflex_rl.verl.data import COLUMNS, TEST_FILE, TRAIN_FILE, build_rows, main, verl_row
from dataflex_rl.verl.reward import compute_score, verl_tasks
from tests import registry_snapshot

ECHO = "echo_test_task"
PLAIN = "plain_test_task"


@dataclasses.dataclass(frozen=True)
class EchoConfig:
    """Numbers 0..largest; the model answers ``n.`` to ``n=``."""

    largest: int = 99
    test_size: int = 8
    test_seed: int = 5

    def __post_init__(self) -> None:
        check_int_at_least("largest", self.largest, 10)


class EchoTask(Task):
    """Repeat the number: the smallest task with every verl hook and one reward option."""

    name = ECHO
    config_class = EchoConfig
    verl_ability = "echo"
    verl_reward_options = ("echo_scale",)

    def sample_problem(self, rng: random.Random) -> Problem:
        number = rng.randint(0, self.config.largest)
        return Problem(f"{number}=", f"{number}.", number, len(str(number)), str(number))

    def build_test_pool(self) -> list[Problem]:
        rng, pool = random.Random(self.config.test_seed), {}
        while len(pool) < self.config.test_size:
            problem = self.sample_problem(rng)
            pool.setdefault(problem.key, problem)
        return list(pool.values())

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return completion.split(".")[0].strip() == str(problem.answer)

    def reward(self, problem: Problem, completion: str) -> float:
        return float(self.is_correct(problem, completion))

    max_prompt_chars = 4
    max_completion_chars = 3
    alphabet = "0123456789.="

    @classmethod
    def verl_score(cls, response: str, answer: Any, echo_scale: float = 1.0) -> dict[str, float]:
        correct = 1.0 if response.split(".")[0].strip() == str(answer) else 0.0
        return {"score": echo_scale * correct, "acc": correct}


class PlainTask(EchoTask):
    """EchoTask without a verl reward (the base class's ``verl_score``): a local-only task."""

    name = PLAIN
    verl_score = Task.verl_score


@pytest.fixture
def echo_registered():
    with registry_snapshot(TASKS):
        TASKS.register(ECHO)(EchoTask)
        TASKS.register(PLAIN)(PlainTask)
        yield
    assert ECHO not in TASKS and PLAIN not in TASKS


def test_a_registered_task_is_scored_with_its_own_reward_options(echo_registered):
    assert ECHO in verl_tasks() and PLAIN not in verl_tasks()
    assert compute_score(ECHO, "17.", "17") == {"score": 1.0, "acc": 1.0}
    assert compute_score(ECHO, "71.", json.dumps(17), {"index": 0}) == {"score": 0.0, "acc": 0.0}
    assert compute_score(ECHO, "17.", "17", echo_scale=2.5) == {"score": 2.5, "acc": 1.0}
    # One reward_kwargs block for a mixed data set: another task's option is left to that task.
    assert compute_score(ECHO, "17.", "17", knights_knaves_reward="binary")["score"] == 1.0
    assert compute_score("arithmetic", "168;", "168", echo_scale=3.0) == {"score": 1.0, "acc": 1.0}
    with pytest.raises(ValueError, match=r"reward_kwargs\.echo_scal=2 is not allowed.*echo_scale, knights_knaves_rew"):
        compute_score(ECHO, "17.", "17", echo_scal=2)
    with pytest.raises(ValueError, match=rf"data_source='{PLAIN}' has no verl reward; allowed: .*'{ECHO}'"):
        compute_score(PLAIN, "17.", "17")


def test_the_adapters_know_no_task_by_name():
    """The dispatch is the registry: neither adapter module names a task."""
    import dataflex_rl.verl.data as data_module

    for module in (reward_module, data_module):
        source = open(module.__file__).read()
        assert "knights_knaves\"" not in source and "arithmetic\"" not in source and "import knights" not in source


def test_data_rows_of_a_registered_task_score_and_keep_test_held_out(echo_registered):
    rows = build_rows(ECHO, {"largest": 50}, train_size=12, test_size=5, seed=3)
    assert [len(rows["train"]), len(rows["test"])] == [12, 5]
    for split in ("train", "test"):
        for index, row in enumerate(rows[split]):
            assert tuple(row) == COLUMNS and row["data_source"] == ECHO and row["ability"] == "echo"
            assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == index
            number = json.loads(row["reward_model"]["ground_truth"])
            assert row["prompt"] == [{"role": "user", "content": f"{number}="}]
            assert compute_score(ECHO, f"{number}.", row["reward_model"]["ground_truth"])["score"] == 1.0
    train_keys = {row["extra_info"]["key"] for row in rows["train"]}
    assert train_keys.isdisjoint(row["extra_info"]["key"] for row in rows["test"])
    assert rows == build_rows(ECHO, {"largest": 50}, train_size=12, test_size=5, seed=3)
    with pytest.raises(ValueError, match=r"largest = 3 is not allowed"):
        build_rows(ECHO, {"largest": 3}, 1, 1)
    with pytest.raises(ValueError, match=r"unknown echo_test_task task param 'biggest'"):
        build_rows(ECHO, {"biggest": 3}, 1, 1)
    with pytest.raises(ValueError, match=rf"data_source='{PLAIN}'"):
        verl_row(Problem("1=", "1.", 1, 1, "1"), PLAIN, "train", 0)


def test_cli_writes_a_registered_tasks_files(echo_registered, tmp_path, capsys):
    out = tmp_path / "echo"
    assert main(["--out", str(out), "--task", ECHO, "--train-size", "6", "--test-size", "4", "largest=20"]) == 0
    train, test = pd.read_parquet(out / TRAIN_FILE), pd.read_parquet(out / TEST_FILE)
    assert (len(train), len(test)) == (6, 4) and set(train.data_source) == {ECHO}
    assert all(0 <= json.loads(truth["ground_truth"]) <= 20 for truth in train.reward_model)
    assert "train: 6 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad"), "--task", PLAIN])
    assert f"data_source='{PLAIN}' has no verl reward" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "bad"), "--task", ECHO, "largest"])
    assert "write KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # nothing written after a refused argument


def test_verls_loader_finds_the_reward(verl_config):
    verl_config.reward.custom_reward_function.path = "pkg://dataflex_rl.verl.reward"
    loaded = get_custom_reward_fn(verl_config)
    assert loaded.args[0] is compute_score  # verl wraps it in partial(_call_with_kwargs, function, reward_kwargs)
    assert loaded(data_source="arithmetic", solution_str="5;", ground_truth="5")["score"] == 1.0

