"""Reward function for verl's ``reward.custom_reward_function`` and the dataset rows it scores.

verl 0.9.1's reward managers call ``compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`` with ``solution_str`` the decoded response only (no prompt, special tokens skipped), and merge
``reward.custom_reward_function.reward_kwargs`` into the keyword arguments. Point verl at it with (``pkg://``
imports the installed module; a file path works too)::

    reward.custom_reward_function.path=pkg://dataflex_rl.tasks.reward_fn
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.knights_knaves_reward=logic_rl   # or binary

Ground truth (the parquet column ``reward_model.ground_truth``) is always a JSON string, ``json.dumps(problem.answer)``:
for ``knights_knaves`` the whole :meth:`Puzzle.to_dict` (the parser needs the names, not only the solution), for
``arithmetic`` the integer. :func:`verl_row` writes rows in that form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dataflex_rl.tasks.arithmetic import TASK_NAME as ARITHMETIC
from dataflex_rl.tasks.arithmetic import arithmetic_score
from dataflex_rl.tasks.base import Problem
from dataflex_rl.tasks.knights_knaves import (
    REWARDS as KNIGHTS_KNAVES_REWARDS,
)
from dataflex_rl.tasks.knights_knaves import (
    TASK_NAME as KNIGHTS_KNAVES,
)
from dataflex_rl.tasks.knights_knaves import (
    Puzzle,
    logic_rl_score,
    parse_chat_answer,
    render_chat_messages,
)

DATA_SOURCES = (ARITHMETIC, KNIGHTS_KNAVES)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    knights_knaves_reward: str = "logic_rl",
    reward_router_address: Any = None,
    reward_model_tokenizer: Any = None,
) -> dict[str, float]:
    """Score one response: ``{"score": reward, "acc": 1.0 if the answer is right else 0.0}``.

    ``knights_knaves``: the chat rendering's parser with the ``logic_rl`` reward (3, -0.5, -1, -3) or, with
    ``reward_kwargs.knights_knaves_reward=binary``, 1.0/0.0. ``arithmetic``: 1.0 when the text before the first
    ``;`` is the integer answer, else 0.0. ``extra_info`` and the reward-router arguments verl may pass are unused.
    verl's reward managers take ``score`` as the reward and log every key, so ``val-core/<source>/acc`` is the
    accuracy (with a plain float verl would log the Logic-RL score under ``acc``).
    """
    truth = _load(ground_truth)
    if data_source == KNIGHTS_KNAVES:
        puzzle = Puzzle.from_dict(truth)
        correct = 1.0 if parse_chat_answer(solution_str, puzzle.names) == puzzle.solution else 0.0
        if knights_knaves_reward == "logic_rl":
            return {"score": logic_rl_score(solution_str, puzzle), "acc": correct}
        if knights_knaves_reward == "binary":
            return {"score": correct, "acc": correct}
        raise ValueError(
            f"knights_knaves_reward={knights_knaves_reward!r} is invalid; allowed: "
            f"{', '.join(map(repr, KNIGHTS_KNAVES_REWARDS))}"
        )
    if data_source == ARITHMETIC:
        score = arithmetic_score(solution_str, truth)
        return {"score": score, "acc": score}
    raise ValueError(f"data_source={data_source!r} has no reward here; allowed: {', '.join(map(repr, DATA_SOURCES))}")


def verl_row(problem: Problem, data_source: str, split: str, index: int) -> dict[str, Any]:
    """One verl RL dataset row: chat messages, ``data_source``, ``reward_model.ground_truth`` (JSON string).

    ``knights_knaves`` rows use the chat rendering's system and user messages whatever the task's rendering;
    ``arithmetic`` rows send the compact prompt as the user message.
    """
    if data_source == KNIGHTS_KNAVES:
        messages = render_chat_messages(Puzzle.from_dict(problem.answer))
        ability = "logic"
    elif data_source == ARITHMETIC:
        messages = [{"role": "user", "content": problem.prompt}]
        ability = "math"
    else:
        raise ValueError(f"data_source={data_source!r} is invalid; allowed: {', '.join(map(repr, DATA_SOURCES))}")
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(problem.answer)},
        "extra_info": {"split": split, "index": index, "difficulty": problem.difficulty, "key": problem.key},
    }


def _load(ground_truth: Any) -> Any:
    """A JSON string is decoded; a mapping or number (already decoded by the caller) passes through."""
    if isinstance(ground_truth, (bytes, str)):
        try:
            return json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"ground_truth {ground_truth!r:.200} is not valid JSON: {error}") from error
    if isinstance(ground_truth, Mapping):
        return dict(ground_truth)
    return ground_truth
