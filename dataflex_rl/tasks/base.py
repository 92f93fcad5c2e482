"""The task interface every trainer sees: :class:`Problem`, :class:`Task`, the ``TASKS`` registry, :func:`build_task`.
A task's test pool is fixed by its own ``test_seed`` and ``test_size``; training never samples a problem of it."""

from __future__ import annotations

import abc
import dataclasses
import random
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, ClassVar

from dataflex_rl.registry import Registry
from dataflex_rl.validation import check_non_negative_int, unknown_keys

TASKS: Registry[type[Task]] = Registry("task")

# Consecutive rejected draws after which sampling gives up (the test pool holds almost every problem).
MAX_CONSECUTIVE_REJECTIONS = 100_000


@dataclasses.dataclass(frozen=True)
class Problem:
    prompt: str
    completion: str  # the SFT target: the correct answer ending with the task's terminator
    answer: Any  # JSON-able ground truth the reward reads
    difficulty: int  # task-defined (digits, people)
    key: str  # canonical identity, for train/test disjointness


class Task(abc.ABC):
    name: ClassVar[str]
    config_class: ClassVar[type]

    def __init__(self, config: Any) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None) -> Task:
        """Build from a flat params mapping (the ``task`` block without ``name``); unknown keys raise."""
        task = cls(make_config(cls.name, cls.config_class, params))
        _ = task.test_pool  # built now, so a pool the problem space cannot fill fails at construction
        return task

    # --- what subclasses provide ------------------------------------------------------------------------------
    @abc.abstractmethod
    def sample_problem(self, rng: random.Random) -> Problem:
        """One draw from the task's problem distribution (may be a test problem; the caller filters)."""

    def build_test_pool(self) -> list[Problem]:
        """``config.test_size`` problems with distinct keys, determined by ``config.test_seed`` alone: by default the
        first ``test_size`` distinct problems drawn from it."""
        rng = random.Random(f"{self.name}/test/{self.config.test_seed}")
        pool: dict[str, Problem] = {}
        while len(pool) < self.config.test_size:
            problem = self.sample_problem(rng)
            pool.setdefault(problem.key, problem)
        return list(pool.values())

    @abc.abstractmethod
    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether ``completion`` (generated text after the prompt) answers ``problem`` correctly."""

    @abc.abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """Scalar reward of ``completion`` for ``problem``."""

    @property
    @abc.abstractmethod
    def max_completion_chars(self) -> int:
        """Upper bound on ``len(problem.completion)`` (the correct answer with its terminator)."""

    @property
    def max_new_tokens(self) -> int:
        """The generation budget of a response (one token per character): the longest answer plus slack."""
        return self.max_completion_chars + 2

    @property
    @abc.abstractmethod
    def alphabet(self) -> str:
        """Every character a prompt or completion can contain, sorted (for character-level vocabularies)."""

    # --- shared sampling --------------------------------------------------------------------------------------
    @cached_property
    def test_pool(self) -> tuple[Problem, ...]:
        """The held-out problems (built once, from ``config.test_seed``); duplicate keys raise RuntimeError."""
        pool = tuple(self.build_test_pool())
        keys = {problem.key for problem in pool}
        if len(keys) != len(pool):
            raise RuntimeError(f"{self.name} test pool has duplicate keys ({len(pool) - len(keys)} duplicates)")
        return pool

    @cached_property
    def test_keys(self) -> frozenset[str]:
        return frozenset(problem.key for problem in self.test_pool)

    def train_problems(self, count: int, seed: int) -> list[Problem]:
        """``count`` i.i.d. problems (repeats possible) from ``seed``, none of them in the test pool."""
        return self.draw_outside_test_pool(count, random.Random(f"{self.name}/train/{seed}"), self.sample_problem)

    def sft_problems(self, count: int, seed: int) -> list[Problem]:
        """The SFT warm start's problems; by default :meth:`train_problems` (a task may keep some of them from it)."""
        return self.train_problems(count, seed)

    def draw_outside_test_pool(self, count: int, rng: random.Random,
                               sample: Callable[[random.Random], Problem]) -> list[Problem]:
        """``count`` draws of ``sample(rng)`` that are not in the test pool."""
        check_non_negative_int("count", count)
        test_keys = self.test_keys
        problems: list[Problem] = []
        rejections = 0
        while len(problems) < count:
            problem = sample(rng)
            if problem.key in test_keys:
                rejections += 1
                if rejections >= MAX_CONSECUTIVE_REJECTIONS:
                    raise RuntimeError(
                        f"{self.name}: {rejections} consecutive draws all fell in the test pool; the test pool covers "
                        f"(almost) the whole problem space: lower test_size ({self.config.test_size}) or widen the task"
                    )
                continue
            rejections = 0
            problems.append(problem)
        return problems

    def test_problems(self, count: int, seed: int) -> list[Problem]:
        """The first ``count`` problems of the fixed test pool, in an order shuffled by ``seed``."""
        check_non_negative_int("count", count)
        if count > len(self.test_pool):
            raise ValueError(f"{self.name}: asked for count={count} test problems but the test pool holds test_size="
                             f"{len(self.test_pool)}; raise the task's test_size or ask for fewer")
        problems = list(self.test_pool[:count])
        random.Random(f"{self.name}/test-order/{seed}").shuffle(problems)
        return problems

    # --- verl hooks (read by dataflex_rl.verl.reward and dataflex_rl.verl.data) ---------------------------------
    # The ``ability`` column of verl rows, and the ``reward_kwargs`` names :meth:`verl_score` accepts.
    verl_ability: ClassVar[str] = ""
    verl_reward_options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def has_verl_reward(cls) -> bool:
        """Whether the task overrides :meth:`verl_score`, i.e. verl can train on it."""
        return cls.verl_score.__func__ is not Task.verl_score.__func__

    @classmethod
    def verl_score(cls, response: str, answer: Any, **options: Any) -> dict[str, float]:
        """Score one decoded verl response (verl's ``solution_str``) against ``problem.answer``."""
        raise NotImplementedError(f"task {cls.name!r} has no verl reward: {cls.__name__} does not define verl_score")

    @classmethod
    def verl_messages(cls, problem: Problem) -> list[dict[str, str]]:
        """The chat messages of verl's ``prompt`` column (verl applies the model's chat template)."""
        return [{"role": "user", "content": problem.prompt}]

    def verl_problems(self, train_size: int, test_size: int, seed: int) -> dict[str, list[Problem]]:
        return {"train": self.train_problems(train_size, seed), "test": self.test_problems(test_size, seed)}


def build_task(name: str, params: Mapping[str, Any] | None = None) -> Task:
    """The task registered as ``name`` (or a dotted path ``pkg.module:TaskClass``) built from ``params``."""
    return TASKS.get(name).from_params(params)


def make_config(task_name: str, config_class: type, params: Mapping[str, Any] | None) -> Any:
    """``config_class(**params)`` after checking every key is one of its fields (error names key, value, allowed)."""
    params = dict(params or {})
    allowed = [field.name for field in dataclasses.fields(config_class)]
    for key in unknown_keys(params, allowed)[:1]:
        raise ValueError(
            f"unknown {task_name} task param {key!r} (value {params[key]!r}); allowed params: {', '.join(allowed)}"
        )
    return config_class(**params)
