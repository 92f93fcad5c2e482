"""Long addition: the reference trace by hand and step by step, the parser's refusals, rewards, the SFT pool."""

from __future__ import annotations

import json
import random
import re

import pytest

from dataflex_rl.tasks import build_task
from dataflex_rl.tasks.long_addition import LongAdditionTask, parse_answer, solve
from dataflex_rl.validation import ConfigError


@pytest.mark.parametrize(("left", "right", "trace"), [
    (472, 389, "2+9+0=11,7+8+1=16,4+3+1=08>861;"),
    (999, 1, "9+1+0=10,9+0+1=10,9+0+1=10>1000;"),  # the shorter operand is padded with zeros
    (7, 5, "7+5+0=12>12;"),
    (0, 0, "0+0+0=00>0;"),
    (1203, 45, "3+5+0=08,0+4+0=04,2+0+0=02,1+0+0=01>1248;"),
])
def test_reference_trace_by_hand(left, right, trace):
    assert solve(left, right) == trace


def test_every_step_of_the_reference_trace_is_right():
    rng = random.Random(0)
    for _ in range(500):
        left, right = rng.randrange(10**6), rng.randrange(10**6)
        trace, answer = solve(left, right).removesuffix(";").split(">")
        width = max(len(str(left)), len(str(right)))
        carry = 0
        for column, step in enumerate(trace.split(",")):
            a, b, c, carry_out, digit = map(int, re.fullmatch(r"(\d)\+(\d)\+(\d)=(\d)(\d)", step).groups())
            assert (a, b) == (left // 10**column % 10, right // 10**column % 10)
            assert c == carry and 10 * carry_out + digit == a + b + c
            carry = carry_out
        assert column == width - 1 and int(answer) == left + right


@pytest.mark.parametrize(("completion", "width", "parsed"), [
    ("2+9+0=11,7+8+1=16,4+3+1=08>861;", 3, 861),
    ("2+9+0=11,7+8+1=16,4+3+1=08>861;junk after", 3, 861),  # the text after the terminator is not read
    ("1+1+0=02,1+1+0=02,1+1+0=02>861;", 3, 861),  # the steps' arithmetic is not checked: reward on the answer
    ("2+9+0=11,7+8+1=16,4+3+1=08>861", 3, None),  # no terminator
    ("2+9+0=11,7+8+1=16,4+3+1=08861;", 3, None),  # no answer mark
    ("2+9+0=11,7+8+1=16>861;", 3, None),  # a step missing
    ("2+9+0=11,7+8+1=16,4+3+1=08,0+0+0=00>861;", 3, None),  # a step too many
    (">861;", 3, None),  # no trace at all
    ("2+9+0=11,7+8+2=17,4+3+1=08>861;", 3, None),  # a carry of 2
    ("2+9+0=11,7+8+1=16,4+3+1=8>861;", 3, None),  # a one-digit step result
    ("2+9+0=11,7+8+1=16,4+3+1=08>0861;", 3, None),  # a leading zero
    ("2+9+0=11,7+8+1=16,4+3+1=08>-861;", 3, None),  # a sign
    ("2+9+0=11,7+8+1=16,4+3+1=08> 861;", 3, None),  # a space
    ("2+9+0=11,7+8+1=16,4+3+1=08>;", 3, None),  # an empty answer
    ("0+0+0=00>0;", 1, 0),
])
def test_parser_accepts_only_a_well_formed_response(completion, width, parsed):
    assert parse_answer(completion, width) == parsed


def test_reward_and_verl_score_read_the_final_answer():
    task = build_task("long_addition", {"test_size": 16})
    problem = task.train_problems(1, seed=3)[0]
    left, right = problem.answer["left"], problem.answer["right"]
    assert task.reward(problem, problem.completion) == 1.0
    wrong = problem.completion.replace(f">{left + right};", f">{left + right + 1};")
    assert wrong != problem.completion and task.reward(problem, wrong) == 0.0
    answer = json.loads(json.dumps(problem.answer))  # as verl's ground_truth column holds it
    assert task.verl_score(problem.completion, answer) == {"score": 1.0, "acc": 1.0}
    assert task.verl_score(problem.completion.replace(">", ""), answer) == {"score": 0.0, "acc": 0.0}


def test_an_answer_longer_than_any_sum_scores_0_never_raising():
    """5,000 digits exceed Python's 4,300-digit int() limit: the response is wrong, not an error."""
    answer = {"left": 7, "right": 5}
    assert LongAdditionTask.verl_score("7+5+0=12>" + "9" * 5000 + ";", answer) == {"score": 0.0, "acc": 0.0}
    assert LongAdditionTask.verl_score("7+5+0=12>12;", answer) == {"score": 1.0, "acc": 1.0}
    assert parse_answer(solve(10**9 - 1, 10**9 - 1), 9) == 2 * (10**9 - 1)  # the longest sum is read


def test_responses_reason_for_at_least_30_tokens_at_the_defaults():
    task = build_task("long_addition", {})
    lengths = [len(problem.completion) for problem in task.train_problems(2000, seed=1)]
    assert sum(lengths) / len(lengths) >= 30
    assert max(lengths) <= task.max_completion_chars == len(solve(9999, 9999))
    assert set("".join(problem.prompt + problem.completion for problem in task.test_pool)) <= set(task.alphabet)


def test_the_warm_start_sees_only_the_short_problems_and_never_the_test_pool():
    task = build_task("long_addition", {"min_digits": 2, "max_digits": 3, "sft_max_digits": 2, "test_size": 64})
    sft = task.sft_problems(3000, seed=5)
    assert {problem.difficulty for problem in sft} == {2}
    assert {problem.difficulty for problem in task.train_problems(3000, seed=5)} == {2, 3}
    assert not {problem.key for problem in sft} & task.test_keys
    assert sft == task.sft_problems(3000, seed=5) != task.sft_problems(3000, seed=6)
    everything = build_task("long_addition", {"min_digits": 2, "max_digits": 3, "test_size": 64})
    assert everything.sft_problems(50, seed=5) == everything.train_problems(50, seed=5)


@pytest.mark.parametrize(("params", "message"), [
    ({"sft_max_digits": 5}, "sft_max_digits = 5 is not allowed: it must be an integer in [3, 4]"),
    ({"sft_max_digits": 2}, "sft_max_digits = 2 is not allowed"),
    ({"max_digits": 10}, "max_digits = 10 is not allowed: it must be an integer in [1, 9]"),
    ({"min_digits": 1, "max_digits": 1, "test_size": 60}, "test_size=60 is too large"),
    # the warm start draws from the one-digit sums alone: a pool holding them all left it nothing (it gave up later)
    ({"min_digits": 1, "max_digits": 2, "sft_max_digits": 1, "test_size": 5000},
     "test_size=5000 is too large: min_digits=1, sft_max_digits=1 give 100 distinct problems; allowed: test_size <= 50"),
])
def test_bad_params_are_refused_naming_key_value_and_what_is_allowed(params, message):
    with pytest.raises((ConfigError, ValueError), match=re.escape(message)):
        build_task("long_addition", params)
