"""Addition written out column by column before the answer: ``472+389=`` -> ``2+9+0=11,7+8+1=16,4+3+1=08>861;``.
Each step is ``digit+digit+carry_in=carry_out sum_digit``, least significant column first; the reward reads the
answer after ``>`` only, and only from a response whose every step is well-formed (docs/long_addition.md)."""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

from dataflex_rl.tasks.arithmetic import operand_range, problem_space_size
from dataflex_rl.tasks.base import TASKS, Problem, Task
from dataflex_rl.validation import check_int_in_range, check_non_negative_int

TASK_NAME = "long_addition"
TERMINATOR = ";"
STEP_SEPARATOR = ","
ANSWER_MARK = ">"
MAX_DIGITS_LIMIT = 9
_STEP = r"[0-9]\+[0-9]\+[01]=[01][0-9]"
# A sum has at most MAX_DIGITS_LIMIT + 1 digits; a longer text is wrong, and int() of one could exceed 4,300 digits.
_ANSWER = re.compile(rf"0|[1-9][0-9]{{0,{MAX_DIGITS_LIMIT}}}")


@dataclasses.dataclass(frozen=True)
class LongAdditionConfig:
    """``task=long_addition``: operands of ``min_digits`` to ``max_digits`` digits; the SFT warm start sees only
    problems whose operands have at most ``sft_max_digits`` digits (None: every problem), so RL has the longer
    ones left to learn."""

    max_digits: int = 4
    min_digits: int = 3
    sft_max_digits: int | None = None
    test_size: int = 1024
    test_seed: int = 12345

    def __post_init__(self) -> None:
        check_int_in_range("max_digits", self.max_digits, 1, MAX_DIGITS_LIMIT)
        check_int_in_range("min_digits", self.min_digits, 1, self.max_digits)
        if self.sft_max_digits is not None:
            check_int_in_range("sft_max_digits", self.sft_max_digits, self.min_digits, self.max_digits)
        check_non_negative_int("test_size", self.test_size)
        check_non_negative_int("test_seed", self.test_seed)
        # Half the space at most (the warm start's, when smaller), so sampling train problems never stalls.
        largest = self.max_digits if self.sft_max_digits is None else self.sft_max_digits
        space = problem_space_size(self.min_digits, largest, 1)
        if self.test_size > space // 2:
            raise ValueError(f"{TASK_NAME} task param test_size={self.test_size} is too large: min_digits="
                             f"{self.min_digits}, {'sft_' if self.sft_max_digits is not None else ''}max_digits="
                             f"{largest} give {space} distinct problems; allowed: test_size <= {space // 2}")


def columns(left: int, right: int) -> int:
    return max(len(str(left)), len(str(right)))


def solve(left: int, right: int) -> str:
    """The reference trace with its answer and terminator, e.g. ``solve(7, 5) == "7+5+0=12>12;"``."""
    width = columns(left, right)
    top, bottom = str(left).zfill(width), str(right).zfill(width)
    steps, carry = [], 0
    for a, b in zip(reversed(top), reversed(bottom), strict=True):
        total = int(a) + int(b) + carry
        steps.append(f"{a}+{b}+{carry}={total // 10}{total % 10}")
        carry = total // 10
    return f"{STEP_SEPARATOR.join(steps)}{ANSWER_MARK}{left + right}{TERMINATOR}"


def parse_answer(completion: str, width: int) -> int | None:
    """The answer of a well-formed response to a problem of ``width`` columns: exactly ``width`` steps (their
    arithmetic is not checked), ``>``, a number without leading zeros, then ``;``. None otherwise."""
    text, terminated, _ = completion.partition(TERMINATOR)
    trace, marked, answer = text.partition(ANSWER_MARK)
    if not (terminated and marked and _ANSWER.fullmatch(answer)):
        return None
    steps = trace.split(STEP_SEPARATOR)
    if len(steps) != width or not all(re.fullmatch(_STEP, step) for step in steps):
        return None
    return int(answer)


@TASKS.register(TASK_NAME)
class LongAdditionTask(Task):
    """``a+b=`` -> the column trace, ``>``, ``a+b``, ``;``; reward 1 for the right answer of a well-formed response."""

    config_class = LongAdditionConfig
    verl_ability = "math"

    def sample_problem(self, rng: random.Random) -> Problem:
        return self._sample(rng, self.config.max_digits)

    def _sample(self, rng: random.Random, max_digits: int) -> Problem:
        """Digit count uniform per operand, then the value uniform."""
        left, right = (rng.randint(*operand_range(rng.randint(self.config.min_digits, max_digits)))
                       for _ in range(2))
        return Problem(prompt=f"{left}+{right}=", completion=solve(left, right),
                       answer={"left": left, "right": right}, difficulty=columns(left, right), key=f"{left}+{right}")

    def sft_problems(self, count: int, seed: int) -> list[Problem]:
        """Training problems with operands of at most ``sft_max_digits`` digits (none of the test pool)."""
        if self.config.sft_max_digits is None:
            return self.train_problems(count, seed)
        return self.draw_outside_test_pool(count, random.Random(f"{self.name}/sft/{seed}"),
                                           lambda rng: self._sample(rng, self.config.sft_max_digits))

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.verl_score(completion, problem.answer)["acc"] == 1.0

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if self.is_correct(problem, completion) else 0.0

    @property
    def max_completion_chars(self) -> int:
        largest = 10**self.config.max_digits - 1
        return len(solve(largest, largest))

    @property
    def alphabet(self) -> str:
        return "".join(sorted(set("0123456789+=") | {STEP_SEPARATOR, ANSWER_MARK, TERMINATOR}))

    @classmethod
    def verl_score(cls, response: str, answer: Any, **options: Any) -> dict[str, float]:
        """Binary score of ``response`` against ``{"left": a, "right": b}``."""
        left, right = int(answer["left"]), int(answer["right"])
        score = 1.0 if parse_answer(response, columns(left, right)) == left + right else 0.0
        return {"score": score, "acc": score}
