"""The task interface every trainer sees: :class:`Problem`, :class:`Task`, the ``TASKS`` registry and
:func:`build_task`.

A task owns a held-out test pool fixed by its own ``test_seed`` and ``test_size`` params, not by the caller's seed.
``train_problems`` rejects every problem whose ``key`` is in that pool, so the train set of any seed is disjoint from
the test set of every seed: a sweep that varies the run seed still evaluates every run on the same problems, none of
which any run trained on. ``test_problems(count, seed)`` returns the first ``count`` problems of the pool (a prefix of
a random sample is itself a random sample), in an order shuffled by ``seed``; the set depends only on ``count``.

A task that verl can train on also gives the verl hooks (``verl_score``, ``verl_messages``, ``verl_ability``,
``verl_reward_options``, optionally ``verl_problems``): the verl backend's reward function
(:mod:`dataflex_rl.verl.reward`) and data preparation (:mod:`dataflex_rl.verl.data`) find the task by its registered
name (verl's ``data_source``) and call only these, so adding a task never edits them. The hooks are plain Python:
this package imports neither torch nor verl.
"""

from __future__ import annotations

import abc
import dataclasses
import random
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

from dataflex_rl.registry import Registry
from dataflex_rl.validation import unknown_keys

TASKS: Registry[type[Task]] = Registry("task")

# Consecutive rejected draws after which sampling gives up: only reachable when the test pool holds (almost) every
# problem the generator can produce, which a config check should have refused first.
MAX_CONSECUTIVE_REJECTIONS = 100_000


@dataclasses.dataclass(frozen=True)
class Problem:
    """One prompt with its ground truth.

    ``prompt``: the text the model is conditioned on. ``completion``: the SFT target, the correct answer text
    ending with the task's terminator. ``answer``: JSON-able ground truth the reward reads. ``difficulty``: a
    task-defined integer (digits, people). ``key``: canonical identity used for train/test disjointness.
    """

    prompt: str
    completion: str
    answer: Any
    difficulty: int
    key: str


class Task(abc.ABC):
    """A problem generator with a reward. Subclasses set ``name``, ``config_class`` and ``terminator``.

    Subclasses implement :meth:`sample_problem` (one i.i.d. draw from the train/test distribution),
    :meth:`build_test_pool` (``config.test_size`` distinct problems from ``config.test_seed``), :meth:`is_correct`,
    :meth:`reward` and the two length bounds.
    """

    name: ClassVar[str]
    config_class: ClassVar[type]
    terminator: str  # the answer terminator of the rendering (may differ per instance)

    def __init__(self, config: Any) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None) -> Task:
        """Build from a flat params mapping (``conf/task/<name>.yaml`` without ``name``); unknown keys raise."""
        task = cls(make_config(cls.name, cls.config_class, params))
        _ = task.test_pool  # built now, so a pool the problem space cannot fill fails at construction
        return task

    # --- what subclasses provide ------------------------------------------------------------------------------
    @abc.abstractmethod
    def sample_problem(self, rng: random.Random) -> Problem:
        """One draw from the task's problem distribution (may be a test problem; the caller filters)."""

    @abc.abstractmethod
    def build_test_pool(self) -> list[Problem]:
        """``config.test_size`` problems with distinct keys, determined by ``config.test_seed`` alone."""

    @abc.abstractmethod
    def is_correct(self, problem: Problem, completion: str) -> bool:
        """Whether ``completion`` (generated text after the prompt) answers ``problem`` correctly."""

    @abc.abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """Scalar reward of ``completion`` for ``problem``."""

    @property
    @abc.abstractmethod
    def max_prompt_chars(self) -> int:
        """Upper bound on ``len(problem.prompt)`` over every problem the task can produce."""

    @property
    @abc.abstractmethod
    def max_completion_chars(self) -> int:
        """Upper bound on ``len(problem.completion)`` (the correct answer with its terminator)."""

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
        """The keys of :attr:`test_pool`, which train problems never repeat."""
        return frozenset(problem.key for problem in self.test_pool)

    def train_problems(self, count: int, seed: int) -> list[Problem]:
        """``count`` i.i.d. problems (repeats possible) from ``seed``, none of them in the test pool."""
        _check_count("count", count)
        rng = random.Random(f"{self.name}/train/{seed}")
        test_keys = self.test_keys
        problems: list[Problem] = []
        rejections = 0
        while len(problems) < count:
            problem = self.sample_problem(rng)
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
        _check_count("count", count)
        if count > len(self.test_pool):
            raise ValueError(
                f"{self.name}: asked for count={count} test problems but the test pool holds test_size="
                f"{len(self.test_pool)}; raise the task's test_size or ask for fewer"
            )
        problems = list(self.test_pool[:count])
        random.Random(f"{self.name}/test-order/{seed}").shuffle(problems)
        return problems

    # --- verl hooks (read by dataflex_rl.verl.reward and dataflex_rl.verl.data) ---------------------------------
    # The ``ability`` column of the task's verl rows (a free label verl carries along), and the names of the
    # ``reward.custom_reward_function.reward_kwargs`` that :meth:`verl_score` accepts.
    verl_ability: ClassVar[str] = ""
    verl_reward_options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def has_verl_reward(cls) -> bool:
        """Whether the task overrides :meth:`verl_score`, i.e. verl can train on it."""
        return cls.verl_score.__func__ is not Task.verl_score.__func__

    @classmethod
    def verl_score(cls, response: str, answer: Any, **options: Any) -> dict[str, float]:
        """Score one decoded verl response: ``{"score": reward, "acc": 1.0 if right else 0.0}``.

        ``response``: the generated text only (verl's ``solution_str``); ``answer``: ``problem.answer`` as decoded
        from the row's JSON ground truth; ``options``: the reward kwargs named in :attr:`verl_reward_options`.
        A task without this hook is local-only.
        """
        raise NotImplementedError(f"task {cls.name!r} has no verl reward: {cls.__name__} does not define verl_score")

    @classmethod
    def verl_messages(cls, problem: Problem) -> list[dict[str, str]]:
        """The chat messages of verl's ``prompt`` column (verl applies the model's chat template); by default the
        task's prompt as the one user message."""
        return [{"role": "user", "content": problem.prompt}]

    def verl_problems(self, train_size: int, test_size: int, seed: int) -> dict[str, list[Problem]]:
        """The problems of verl's ``train`` and ``test`` files: by default ``train_problems(train_size, seed)`` and
        the first ``test_size`` problems of the held-out pool; a task overrides this for another split."""
        return {"train": self.train_problems(train_size, seed), "test": self.test_problems(test_size, seed)}


def build_task(name: str, params: Mapping[str, Any] | None = None) -> Task:
    """The task registered as ``name`` (or a dotted path ``pkg.module:TaskClass``) built from ``params``."""
    task_class = TASKS.get(name)
    return task_class.from_params(params)


def make_config(task_name: str, config_class: type, params: Mapping[str, Any] | None) -> Any:
    """``config_class(**params)`` after checking every key is one of its fields (error names key, value, allowed)."""
    params = dict(params or {})
    allowed = [field.name for field in dataclasses.fields(config_class)]
    for key in unknown_keys(params, allowed)[:1]:
        raise ValueError(
            f"unknown {task_name} task param {key!r} (value {params[key]!r}); allowed params: {', '.join(allowed)}"
        )
    return config_class(**params)


# --- value checks shared by the task configs ------------------------------------------------------------------
def check_int(task_name: str, key: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in ``[minimum, maximum]``; otherwise a ValueError naming key, value and the range."""
    upper = "" if maximum is None else f" and <= {maximum}"
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        raise ValueError(f"{task_name} task param {key}={value!r} is invalid; allowed: an int >= {minimum}{upper}")
    return int(value)


def check_choice(task_name: str, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    """``value`` when it is one of ``allowed``; otherwise a ValueError naming key, value and the choices."""
    if value not in allowed:
        raise ValueError(f"{task_name} task param {key}={value!r} is invalid; allowed: {', '.join(map(repr, allowed))}")
    return value


def _check_count(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}={value!r} is invalid; allowed: an int >= 0")
