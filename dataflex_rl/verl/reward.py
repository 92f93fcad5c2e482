"""Reward function for verl's ``reward.custom_reward_function``: every registered task with a verl reward.

verl 0.9.1's reward managers call ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` with ``solution_str`` the decoded response only (no prompt, special tokens skipped), and merge
``reward.custom_reward_function.reward_kwargs`` into the keyword arguments. Point verl at it with (``pkg://``
imports the installed module; a file path works too)::

    reward.custom_reward_function.path=pkg://dataflex_rl.verl.reward
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.knights_knaves_reward=logic_rl   # or binary

``data_source`` is the task's registered name (:data:`dataflex_rl.tasks.TASKS`, or a dotted path
``pkg.module:TaskClass``); the task's :meth:`~dataflex_rl.tasks.Task.verl_score` scores the response, so a new task
needs no edit here. Ground truth (the parquet column ``reward_model.ground_truth``) is always a JSON string,
``json.dumps(problem.answer)`` (:func:`dataflex_rl.verl.data.verl_row` writes rows in that form).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dataflex_rl.registry import RegistryError
from dataflex_rl.tasks import TASKS, Task


def verl_tasks() -> list[str]:
    """The registered tasks that verl can train on (they define ``verl_score``), sorted."""
    return [name for name in TASKS.names() if TASKS.get(name).has_verl_reward()]


def verl_task(data_source: str) -> type[Task]:
    """The task class of a verl row's ``data_source``; a ValueError naming it and the choices when there is none."""
    try:
        task_class = TASKS.get(data_source)
    except RegistryError:
        task_class = None
    if task_class is None or not task_class.has_verl_reward():
        raise ValueError(
            f"data_source={data_source!r} has no verl reward; allowed: {', '.join(map(repr, verl_tasks()))} "
            f"(a registered task whose class defines verl_score)"
        )
    return task_class


def reward_options(task_class: type[Task], reward_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The reward kwargs meant for ``task_class``; a kwarg no verl task reads raises, naming key, value, allowed.

    Options of other tasks are dropped, so one ``reward_kwargs`` block serves a data set mixing tasks.
    """
    own = task_class.verl_reward_options
    if all(key in own for key in reward_kwargs):  # the common case, once per response: no registry walk
        return dict(reward_kwargs)
    known = {option for name in verl_tasks() for option in TASKS.get(name).verl_reward_options}
    for key, value in reward_kwargs.items():
        if key not in known and key not in own:
            raise ValueError(
                f"reward.custom_reward_function.reward_kwargs.{key}={value!r} is not allowed: no task reads it; "
                f"allowed: {', '.join(sorted(known)) or '(none)'}"
            )
    return {key: value for key, value in reward_kwargs.items() if key in own}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    reward_router_address: Any = None,
    reward_model_tokenizer: Any = None,
    **reward_kwargs: Any,
) -> dict[str, float]:
    """Score one response: ``{"score": reward, "acc": 1.0 if the answer is right else 0.0}``.

    The task named ``data_source`` scores it (``verl_score``) with its own ``reward_kwargs``. ``knights_knaves``:
    the chat rendering's parser with the ``logic_rl`` reward (3, -0.5, -1, -3) or, with
    ``reward_kwargs.knights_knaves_reward=binary``, 1.0/0.0. ``arithmetic``: 1.0 when the text before the first
    ``;`` is the integer answer, else 0.0. ``extra_info`` and the reward-router arguments verl may pass are unused.
    verl's reward managers take ``score`` as the reward and log every key, so ``val-core/<source>/acc`` is the
    accuracy (with a plain float verl would log the Logic-RL score under ``acc``).
    """
    task_class = verl_task(data_source)
    return task_class.verl_score(solution_str, decode_ground_truth(ground_truth),
                                 **reward_options(task_class, reward_kwargs))


def decode_ground_truth(ground_truth: Any) -> Any:
    """A JSON string is decoded; a mapping or number (already decoded by the caller) passes through."""
    if isinstance(ground_truth, (bytes, str)):
        try:
            return json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth {ground_truth!r:.200} is not valid JSON: {error}") from error
    if isinstance(ground_truth, Mapping):
        return dict(ground_truth)
    return ground_truth
