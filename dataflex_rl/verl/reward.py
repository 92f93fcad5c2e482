"""``compute_score`` for verl's ``reward.custom_reward_function``: the task named ``data_source`` scores."""

import json
from collections.abc import Mapping
from typing import Any

from dataflex_rl.registry import RegistryError
from dataflex_rl.tasks import TASKS, Task


def verl_tasks() -> list[str]:
    return [name for name in TASKS.names() if TASKS.get(name).has_verl_reward()]


def verl_task(data_source: str) -> type[Task]:
    try:
        task_class = TASKS.get(data_source)
    except RegistryError:
        task_class = None
    if task_class is None or not task_class.has_verl_reward():
        raise ValueError(f"data_source={data_source!r} has no verl reward; allowed: "
                         f"{', '.join(map(repr, verl_tasks()))} (a registered task whose class defines verl_score)")
    return task_class


def reward_options(task_class: type[Task], reward_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    own = task_class.verl_reward_options
    if all(key in own for key in reward_kwargs):  # the common case, once per response: no registry walk
        return dict(reward_kwargs)
    known = {option for name in verl_tasks() for option in TASKS.get(name).verl_reward_options}
    for key, value in reward_kwargs.items():
        if key not in known and key not in own:
            raise ValueError(f"reward.custom_reward_function.reward_kwargs.{key}={value!r} is not allowed: no task "
                             f"reads it; allowed: {', '.join(sorted(known)) or '(none)'}")
    return {key: value for key, value in reward_kwargs.items() if key in own}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  *, reward_router_address: Any = None, reward_model_tokenizer: Any = None,
                  **reward_kwargs: Any) -> dict[str, float]:
    """Score one response with the ``verl_score`` of task ``data_source``: ``{"score", "acc"}``."""
    task_class = verl_task(data_source)
    if isinstance(ground_truth, (bytes, str)):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth {ground_truth!r:.200} is not valid JSON: {error}") from error
    elif isinstance(ground_truth, Mapping):
        ground_truth = dict(ground_truth)
    return task_class.verl_score(solution_str, ground_truth, **reward_options(task_class, reward_kwargs))
