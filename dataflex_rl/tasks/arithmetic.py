"""Integer arithmetic for a character-level model: ``123+45=`` -> ``168;`` (docs/architecture.md#tasks)."""

from __future__ import annotations

import dataclasses
import operator
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from dataflex_rl.tasks.base import TASKS, Problem, Task
from dataflex_rl.validation import check_int_in_range, check_non_negative_int

TASK_NAME = "arithmetic"
TERMINATOR = ";"
OPERATIONS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
MAX_DIGITS_LIMIT = 12
# An integer with at most a product's digits after its leading zeros: no answer is longer, and int() of a longer
# text could exceed Python's 4,300-digit limit.
_INTEGER = re.compile(rf"(-?)0*([0-9]{{1,{2 * MAX_DIGITS_LIMIT}}})")


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    """``task=arithmetic``: operands of ``min_digits`` to ``max_digits`` digits, ``ops`` any of ``+``, ``-``, ``*``."""

    max_digits: int = 3
    min_digits: int = 1
    ops: Sequence[str] = ("+",)
    test_size: int = 1024
    test_seed: int = 12345

    def __post_init__(self) -> None:
        check_int_in_range("max_digits", self.max_digits, 1, MAX_DIGITS_LIMIT)
        check_int_in_range("min_digits", self.min_digits, 1, self.max_digits)
        check_non_negative_int("test_size", self.test_size)
        check_non_negative_int("test_seed", self.test_seed)
        allowed = ", ".join(map(repr, OPERATIONS))
        if isinstance(self.ops, str) or not isinstance(self.ops, Sequence) or len(self.ops) == 0:
            raise ValueError(
                f"{TASK_NAME} task param ops={self.ops!r} is invalid; allowed: a non-empty list of {allowed}"
            )
        ops = tuple(self.ops)
        for op in ops:
            if op not in OPERATIONS:
                raise ValueError(
                    f"{TASK_NAME} task param ops={list(ops)!r}: {op!r} is not supported; allowed: {allowed}"
                )
        if len(set(ops)) != len(ops):
            raise ValueError(f"{TASK_NAME} task param ops={list(ops)!r} repeats an operation; list each once")
        object.__setattr__(self, "ops", ops)
        space = problem_space_size(self.min_digits, self.max_digits, len(ops))
        # Half the space at most, so rejection sampling of train problems never stalls.
        if self.test_size > space // 2:
            raise ValueError(
                f"{TASK_NAME} task param test_size={self.test_size} is too large: with min_digits={self.min_digits}, "
                f"max_digits={self.max_digits}, ops={list(ops)} there are {space} distinct problems; allowed: "
                f"test_size <= {space // 2}"
            )


def problem_space_size(min_digits: int, max_digits: int, num_ops: int) -> int:
    """Number of distinct problems: ``num_ops * (number of operands)**2``."""
    operands = 10**max_digits - operand_range(min_digits)[0]  # every integer from the smallest operand up
    return num_ops * operands * operands


def operand_range(digits: int) -> tuple[int, int]:
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def make_problem(left: int, op: str, right: int) -> Problem:
    """The problem ``left op right`` with its exact answer, e.g. ``make_problem(12, "-", 30).completion == "-18;"``."""
    answer = OPERATIONS[op](left, right)
    expression = f"{left}{op}{right}"
    return Problem(prompt=f"{expression}=",
                   completion=f"{answer}{TERMINATOR}", answer=answer, difficulty=max(len(str(left)), len(str(right))),
                   key=expression)


def parse_answer(completion: str) -> int | None:
    """The integer before the first terminator, or None when that text (stripped) is not ``-?[0-9]+`` with at most
    ``2 * MAX_DIGITS_LIMIT`` digits after its leading zeros."""
    match = _INTEGER.fullmatch(completion.split(TERMINATOR, 1)[0].strip())
    return int(match[1] + match[2]) if match else None


@TASKS.register(TASK_NAME)
class ArithmeticTask(Task):
    """``a op b=`` -> ``result;`` with a binary reward."""

    config_class = ArithmeticConfig
    verl_ability = "math"

    def __init__(self, config: ArithmeticConfig) -> None:
        super().__init__(config)
        self._ops: tuple[str, ...] = tuple(config.ops)
        self._digit_counts = tuple(range(config.min_digits, config.max_digits + 1))

    def sample_problem(self, rng: random.Random) -> Problem:
        """Two operands (digit count uniform, then value uniform) and an operation drawn from ``ops``."""
        left, right = self._sample_operand(rng), self._sample_operand(rng)
        op = self._ops[0] if len(self._ops) == 1 else rng.choice(self._ops)
        return make_problem(left, op, right)

    def _sample_operand(self, rng: random.Random) -> int:
        low, high = operand_range(rng.choice(self._digit_counts))
        return rng.randint(low, high)

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether the integer before the first ``;`` equals the answer (see :func:`parse_answer`)."""
        return parse_answer(completion) == problem.answer

    def reward(self, problem: Problem, completion: str) -> float:
        return 1.0 if self.is_correct(problem, completion) else 0.0

    @property
    def max_completion_chars(self) -> int:
        """The longest result of any allowed operation on ``max_digits`` operands, plus the terminator."""
        largest = 10**self.config.max_digits - 1
        extremes = {"+": largest + largest, "-": 0 - largest, "*": largest * largest}
        return max(len(str(extremes[op])) for op in self._ops) + len(TERMINATOR)

    @property
    def alphabet(self) -> str:
        """Digits, ``=``, the operations and the terminator."""
        return "".join(sorted(set("0123456789=") | set(self._ops) | set(TERMINATOR)))

    @classmethod
    def verl_score(cls, response: str, answer: Any, **options: Any) -> dict[str, float]:
        """Binary score of ``response`` against an integer ``answer`` (int or its decimal string)."""
        score = 1.0 if parse_answer(response) == int(str(answer).strip()) else 0.0
        return {"score": score, "acc": score}
