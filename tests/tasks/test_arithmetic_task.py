"""Arithmetic task: rendering, parsing, rewards, sampling, train/test disjointness."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataflex_rl.tasks import build_task
from dataflex_rl.tasks.arithmetic import ArithmeticTask, make_problem, parse_answer, problem_space_size


@pytest.mark.parametrize(
    ("left", "op", "right", "prompt", "completion", "answer", "difficulty"),
    [
        (123, "+", 45, "123+45=", "168;", 168, 3),
        (9, "+", 1, "9+1=", "10;", 10, 1),
        (12, "-", 30, "12-30=", "-18;", -18, 2),
        (500, "-", 7, "500-7=", "493;", 493, 3),
        (123, "*", 45, "123*45=", "5535;", 5535, 3),
        (0, "*", 999, "0*999=", "0;", 0, 3),
        (7, "-", 7, "7-7=", "0;", 0, 1),
    ],
)
def test_make_problem_hand_values(
    left: int, op: str, right: int, prompt: str, completion: str, answer: int, difficulty: int
) -> None:
    problem = make_problem(left, op, right)
    assert (problem.prompt, problem.completion, problem.answer, problem.difficulty) == (
        prompt, completion, answer, difficulty,
    )  # fmt: skip
    assert problem.key == prompt[:-1]


@pytest.mark.parametrize(
    ("completion", "parsed"),
    [
        ("168;", 168),
        ("168;junk after the terminator 999", 168),
        ("168", 168),  # stopped at EOS before the terminator
        (" 168 ;", 168),
        ("-18;", -18),
        ("0;", 0),
        ("", None),
        (";", None),
        ("-;", None),
        ("+168;", None),
        ("16 8;", None),
        ("168.0;", None),
        ("abc;168;", None),
        ("١٦٨;", None),  # non-ASCII digits are not accepted
    ],
)
def test_parse_answer(completion: str, parsed: int | None) -> None:
    assert parse_answer(completion) == parsed


def test_reward_and_is_correct() -> None:
    task = build_task("arithmetic", {"ops": ["+", "-", "*"]})
    problem = make_problem(12, "-", 30)
    cases = {"-18;": 1.0, "-18;7": 1.0, "-18": 1.0, "18;": 0.0, "-19;": 0.0, "": 0.0, "x": 0.0, ";-18": 0.0}
    for completion, reward in cases.items():
        assert task.reward(problem, completion) == reward, completion
        assert task.is_correct(problem, completion) is (reward == 1.0)


def test_an_answer_longer_than_any_result_scores_0_never_raising() -> None:
    """A response of 5,000 digits exceeds Python's 4,300-digit int() limit: it is wrong, not an error."""
    for response in ("9" * 5000 + ";", "-" + "9" * 25 + ";", "0" * 5000 + "4;"):
        assert ArithmeticTask.verl_score(response, 5) == {"score": 0.0, "acc": 0.0}
    assert ArithmeticTask.verl_score("0" * 5000 + "5;", 5) == {"score": 1.0, "acc": 1.0}  # leading zeros, as ever
    assert parse_answer("-" + "9" * 24 + ";") == -(10**24 - 1)  # the longest product of 12-digit operands


def test_problem_space_size() -> None:
    assert problem_space_size(1, 1, 1) == 10 * 10
    assert problem_space_size(1, 2, 1) == 100 * 100  # 0..99
    assert problem_space_size(2, 3, 2) == 2 * 990 * 990  # 10..999, two ops


@pytest.mark.parametrize(
    ("max_digits", "ops", "prompt_chars", "completion_chars"),
    [
        (3, ["+"], 8, 5),  # "999+999=" -> "1998;"
        (3, ["-"], 8, 5),  # "0-999=" -> "-999;"
        (3, ["+", "*"], 8, 7),  # "999*999=" -> "998001;"
        (1, ["+"], 4, 3),  # "9+9=" -> "18;"
    ],
)
def test_length_bounds_hand_values(max_digits: int, ops: list[str], prompt_chars: int, completion_chars: int) -> None:
    task = build_task("arithmetic", {"max_digits": max_digits, "ops": ops, "test_size": 10})
    largest = 10**max_digits - 1
    assert max(len(make_problem(largest, op, largest).prompt) for op in ops) == prompt_chars
    assert task.max_completion_chars == completion_chars


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    max_digits=st.integers(1, 5),
    ops=st.lists(st.sampled_from(["+", "-", "*"]), min_size=1, max_size=3, unique=True),
)
def test_sampled_problems_are_consistent(seed: int, max_digits: int, ops: list[str]) -> None:
    task = build_task("arithmetic", {"max_digits": max_digits, "ops": ops, "test_size": 10})
    for problem in task.train_problems(50, seed):
        left, op, right = _split(problem.key)
        assert op in ops
        assert 1 <= len(str(left)) <= max_digits and 1 <= len(str(right)) <= max_digits
        assert problem.difficulty == max(len(str(left)), len(str(right)))
        assert parse_answer(problem.completion) == problem.answer
        assert task.reward(problem, problem.completion) == 1.0
        assert len(problem.prompt) <= 2 * max_digits + 2
        assert len(problem.completion) <= task.max_completion_chars
        assert set(problem.prompt + problem.completion) <= set(task.alphabet) <= set(string.printable)


def _split(key: str) -> tuple[int, str, int]:
    for position, character in enumerate(key[1:], start=1):
        if character in "+-*":
            return int(key[:position]), character, int(key[position + 1 :])
    raise AssertionError(key)


def test_every_digit_count_is_sampled() -> None:
    task = build_task("arithmetic", {"max_digits": 4, "min_digits": 2})
    difficulties = {problem.difficulty for problem in task.train_problems(400, seed=0)}
    assert difficulties == {2, 3, 4}


def test_reproducible_by_seed() -> None:
    task = build_task("arithmetic", {"ops": ["+", "-"]})
    assert task.train_problems(64, seed=3) == task.train_problems(64, seed=3)
    assert task.train_problems(64, seed=3) != task.train_problems(64, seed=4)
    again = build_task("arithmetic", {"ops": ["+", "-"]})
    assert again.test_pool == task.test_pool


def test_train_never_contains_a_test_problem() -> None:
    # 100 one-digit problems, 50 held out: an unfiltered draw hits the test pool about half the time.
    task = build_task("arithmetic", {"max_digits": 1, "test_size": 50})
    test_keys = {problem.key for problem in task.test_problems(50, seed=0)}
    assert len(test_keys) == 50
    rng = random.Random(0)
    unfiltered = {task.sample_problem(rng).key for _ in range(500)}
    assert unfiltered & test_keys  # so the check below is not vacuous
    for seed in range(5):
        train_keys = {problem.key for problem in task.train_problems(1000, seed)}
        assert not train_keys & test_keys
        assert len(train_keys) == 50  # exactly the other half of the space, all reached


def test_test_problems_fixed_set_seeded_order() -> None:
    task = build_task("arithmetic", {"test_size": 256})
    first = task.test_problems(100, seed=0)
    second = task.test_problems(100, seed=1)
    assert {problem.key for problem in first} == {problem.key for problem in second}
    assert [problem.key for problem in first] != [problem.key for problem in second]
    assert {problem.key for problem in task.test_problems(256, seed=5)} == task.test_keys
    assert {problem.key for problem in first} == {problem.key for problem in task.test_pool[:100]}
    with pytest.raises(ValueError, match=r"count=257.*test_size=256"):
        task.test_problems(257, seed=0)


def test_test_pool_depends_on_test_seed_not_caller_seed() -> None:
    default = build_task("arithmetic", {})
    other = build_task("arithmetic", {"test_seed": 1})
    assert default.test_keys != other.test_keys
    assert len(default.test_keys) == default.config.test_size == 1024
