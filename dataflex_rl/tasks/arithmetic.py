"""Generated integer arithmetic for a character-level model: prompt ``123+45=``, completion ``168;``.

Rendering: printable ASCII only; the answer is the exact integer in base 10 (a leading ``-`` for negative
differences) followed by the terminator ``;``. The parser reads the completion up to the first ``;`` (the whole
completion when there is none, e.g. generation stopped at EOS), strips surrounding whitespace and accepts
``-?[0-9]+``; anything after the terminator is ignored. The reward is binary: 1.0 when the parsed integer equals the
answer, else 0.0.

Sampling: each operand independently draws a digit count uniformly from ``[min_digits, max_digits]``, then a value
uniformly among the integers with that many digits (one digit includes 0), so every difficulty is equally likely
rather than dominated by the largest operands. Difficulty = digits of the larger operand.

Held-out test set: ``test_size`` distinct problems drawn with ``test_seed`` (see :mod:`dataflex_rl.tasks.base`).
Keys are the prompt without ``=``; ``12+34`` and ``34+12`` are different problems (the model sees different text).
"""

from __future__ import annotations

import dataclasses
import operator
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from dataflex_rl.tasks.base import TASKS, Problem, Task, check_int

TASK_NAME = "arithmetic"
TERMINATOR = ";"
OPERATIONS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
MAX_DIGITS_LIMIT = 12
_INTEGER = re.compile(r"-?[0-9]+")


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    """Params of ``conf/task/arithmetic.yaml``. ``ops`` is any sequence of ``+``, ``-``, ``*`` (stored as a tuple)."""

    max_digits: int = 3
    min_digits: int = 1
    ops: Sequence[str] = ("+",)
    test_size: int = 1024
    test_seed: int = 12345

    def __post_init__(self) -> None:
        check_int(TASK_NAME, "max_digits", self.max_digits, 1, MAX_DIGITS_LIMIT)
        check_int(TASK_NAME, "min_digits", self.min_digits, 1, self.max_digits)
        check_int(TASK_NAME, "test_size", self.test_size, 0)
        check_int(TASK_NAME, "test_seed", self.test_seed, 0)
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
    operands = sum(
        _operand_range(digits)[1] - _operand_range(digits)[0] + 1 for digits in range(min_digits, max_digits + 1)
    )
    return num_ops * operands * operands


def _operand_range(digits: int) -> tuple[int, int]:
    """Inclusive bounds of the integers written with exactly ``digits`` digits (0 counts as one digit)."""
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def make_problem(left: int, op: str, right: int) -> Problem:
    """The problem ``left op right`` with its exact answer, e.g. ``make_problem(12, "-", 30).completion == "-18;"``."""
    answer = OPERATIONS[op](left, right)
    expression = f"{left}{op}{right}"
    return Problem(
        prompt=f"{expression}=",
        completion=f"{answer}{TERMINATOR}",
        answer=answer,
        difficulty=max(len(str(left)), len(str(right))),
        key=expression,
    )


def parse_answer(completion: str) -> int | None:
    """The integer before the first terminator, or None when that text is not ``-?[0-9]+`` (after stripping)."""
    text = completion.split(TERMINATOR, 1)[0].strip()
    if not _INTEGER.fullmatch(text):
        return None
    return int(text)


@TASKS.register(TASK_NAME)
class ArithmeticTask(Task):
    """``a op b=`` -> ``result;`` with a binary reward."""

    name = TASK_NAME
    config_class = ArithmeticConfig
    terminator = TERMINATOR
    verl_ability = "math"

    def __init__(self, config: ArithmeticConfig) -> None:
        super().__init__(config)
        self._ops: tuple[str, ...] = tuple(config.ops)
        self._digit_counts = tuple(range(config.min_digits, config.max_digits + 1))

    def sample_problem(self, rng: random.Random) -> Problem:
        """Two operands (digit count uniform, then value uniform) and an operation drawn from ``ops``."""
        left = self._sample_operand(rng)
        right = self._sample_operand(rng)
        op = self._ops[0] if len(self._ops) == 1 else rng.choice(self._ops)
        return make_problem(left, op, right)

    def _sample_operand(self, rng: random.Random) -> int:
        low, high = _operand_range(rng.choice(self._digit_counts))
        return rng.randint(low, high)

    def build_test_pool(self) -> list[Problem]:
        """The first ``test_size`` distinct problems drawn from ``test_seed``."""
        rng = random.Random(f"{self.name}/test/{self.config.test_seed}")
        pool: dict[str, Problem] = {}
        while len(pool) < self.config.test_size:
            problem = self.sample_problem(rng)
            pool.setdefault(problem.key, problem)
        return list(pool.values())

    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether the integer before the first ``;`` equals the answer (see :func:`parse_answer`)."""
        parsed = parse_answer(completion)
        return parsed is not None and parsed == problem.answer

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 for a correct answer, else 0.0."""
        return 1.0 if self.is_correct(problem, completion) else 0.0

    @property
    def max_prompt_chars(self) -> int:
        """Two ``max_digits`` operands, the operation and ``=``."""
        return 2 * self.config.max_digits + 2  # two operands, the operation, "="

    @property
    def max_completion_chars(self) -> int:
        """The longest result of any allowed operation on ``max_digits`` operands, plus the terminator."""
        largest = 10**self.config.max_digits - 1
        extremes = {"+": largest + largest, "-": 0 - largest, "*": largest * largest}
        return max(len(str(extremes[op])) for op in self._ops) + len(TERMINATOR)

    @property
    def alphabet(self) -> str:
        """Digits, ``=``, the operations and the terminator."""
        characters = set("0123456789=") | set(self._ops) | set(TERMINATOR)
        if "-" in self._ops:
            characters.add("-")
        return "".join(sorted(characters))

    @classmethod
    def verl_score(cls, response: str, answer: Any, **options: Any) -> dict[str, float]:
        """verl's reward: :func:`arithmetic_score` as both the score and the accuracy."""
        score = arithmetic_score(response, answer)
        return {"score": score, "acc": score}


def arithmetic_score(solution_str: str, ground_truth: Any) -> float:
    """Binary score of ``solution_str`` against an integer ground truth (int or its decimal string)."""
    expected = int(str(ground_truth).strip())
    parsed = parse_answer(solution_str)
    return 1.0 if parsed is not None and parsed == expected else 0.0
