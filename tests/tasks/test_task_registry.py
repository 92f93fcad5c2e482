"""build_task, the registry, param validation and the task config group."""

from __future__ import annotations

import pytest

from dataflex_rl.compose import compose_train_config, group_choices
from dataflex_rl.run_config import TrainerConfig
from dataflex_rl.registry import RegistryError
from dataflex_rl.tasks import (TASKS, ArithmeticConfig, ArithmeticTask, KnightsKnavesConfig, KnightsKnavesTask,
                               LongAdditionTask, Problem, build_task)


def test_registered_names() -> None:
    assert TASKS.names() == ["arithmetic", "knights_knaves", "long_addition"]
    assert TASKS.get("arithmetic") is ArithmeticTask
    assert TASKS.get("knights_knaves") is KnightsKnavesTask
    assert TASKS.get("long_addition") is LongAdditionTask


def test_unknown_task_lists_registered() -> None:
    with pytest.raises(RegistryError) as error:
        build_task("sudoku", {})
    message = str(error.value)
    assert "sudoku" in message and "arithmetic" in message and "knights_knaves" in message


def test_dotted_path_builds_out_of_tree_class() -> None:
    task = build_task("dataflex_rl.tasks.arithmetic:ArithmeticTask", {"max_digits": 2})
    assert isinstance(task, ArithmeticTask) and task.config.max_digits == 2


@pytest.mark.parametrize(
    ("name", "params", "fragments"),
    [
        ("arithmetic", {"max_digit": 4}, ["'max_digit'", "4", "max_digits", "ops", "test_seed"]),
        ("knights_knaves", {"people": 3}, ["'people'", "3", "num_people", "rendering", "reward"]),
    ],
)
def test_unknown_param_names_key_value_and_allowed(name: str, params: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        build_task(name, params)
    for fragment in fragments:
        assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("name", "params", "fragments"),
    [
        ("arithmetic", {"ops": ["+", "/"]}, ["ops", "'/'", "'+', '-', '*'"]),
        ("arithmetic", {"ops": "+"}, ["ops", "'+'", "non-empty list"]),
        ("arithmetic", {"ops": ["+", "+"]}, ["ops", "repeats"]),
        ("arithmetic", {"max_digits": 0}, ["max_digits = 0", ">= 1"]),
        ("arithmetic", {"max_digits": True}, ["max_digits = True"]),
        ("arithmetic", {"min_digits": 3, "max_digits": 2}, ["min_digits = 3", "[1, 2]"]),
        # 10 one-digit operands squared = 100 problems: at most half may be held out.
        ("arithmetic", {"max_digits": 1, "test_size": 51}, ["test_size=51", "100 distinct", "test_size <= 50"]),
        ("knights_knaves", {"num_people": 1}, ["num_people = 1", ">= 2"]),
        ("knights_knaves", {"num_people": [3, 13]}, ["num_people = 13", "[2, 12]"]),
        ("knights_knaves", {"num_people": []}, ["num_people=[]"]),
        ("knights_knaves", {"rendering": "fancy"}, ["rendering = 'fancy'", "'compact', 'chat'"]),
        ("knights_knaves", {"reward": "dense"}, ["reward = 'dense'", "'binary', 'logic_rl'"]),
        ("knights_knaves", {"reward": "logic_rl"}, ["logic_rl", "rendering='chat'", "rendering='compact'"]),
        ("knights_knaves", {"max_depth": 1}, ["max_depth = 1", ">= 2"]),
        # Two people, depth 2: 219 distinct puzzles, so a test pool may hold at most 109.
        ("knights_knaves", {"num_people": 2}, ["test_size = 256", "219 for num_people=2", "test_size <= 109"]),
    ],
)
def test_bad_values_raise_with_key_value_and_allowed(name: str, params: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        build_task(name, params)
    for fragment in fragments:
        assert fragment in str(error.value)


@pytest.mark.parametrize("name", group_choices("task"))
def test_every_task_of_the_task_group_composes_and_builds(name: str) -> None:
    params = compose_train_config(["run_dir=x", f"task={name}"])["task"]
    assert params.pop("name") == name
    task = build_task(name, params)
    assert task.name == name and task.config == build_task(name).config
    problem = task.train_problems(1, seed=0)[0]
    assert isinstance(problem, Problem)
    assert task.reward(problem, problem.completion) == 1.0


def test_defaults_match_the_brief() -> None:
    assert ArithmeticConfig() == ArithmeticConfig(max_digits=3, min_digits=1, ops=("+",), test_size=1024,
                                                  test_seed=12345)
    assert ArithmeticConfig().test_size >= TrainerConfig().val_size  # every validation item a distinct held-out one
    knights_knaves = KnightsKnavesConfig()
    assert (knights_knaves.num_people, knights_knaves.rendering, knights_knaves.reward) == (3, "compact", "binary")


def test_count_must_be_a_non_negative_int() -> None:
    task = build_task("arithmetic", {})
    with pytest.raises(ValueError, match=r"count = -1"):
        task.train_problems(-1, seed=0)
    with pytest.raises(ValueError, match=r"count = 2\.5"):
        task.test_problems(2.5, seed=0)  # type: ignore[arg-type]
    assert task.train_problems(0, seed=0) == []
