"""Write a registered task's problems as verl RL dataset parquet files (``train.parquet``, ``test.parquet``).

    python -m dataflex_rl.verl.data --out DIR --task NAME [--train-size N] [--test-size N] [--seed S]
        [KEY=VALUE ...]     # the task's params (conf/task/<name>.yaml keys), values in YAML: num_people=[3,4,5]

Each row is :func:`verl_row` of a problem, the columns verl's ``RLHFDataset`` reads: ``prompt`` (the task's
``verl_messages``; verl applies the model's chat template), ``data_source`` (the task's name, which selects its
reward in :func:`dataflex_rl.verl.reward.compute_score`), ``reward_model.ground_truth`` (``problem.answer`` as
JSON), ``extra_info`` (``split``, ``index``, ``difficulty``, ``key``) and ``ability`` (the task's
``verl_ability``). Which problems go in each file is the task's ``verl_problems``: by default ``train_size``
problems from ``seed`` and the first ``test_size`` of the task's held-out pool, never overlapping. Everything here
goes through the task registry, so a new task needs no edit in this module.

The paper's K&K setup (3 to 7 people, 1000 train and 100 test puzzles each) is::

    python -m dataflex_rl.verl.data --out /data/kk --task knights_knaves --train-size 5000 --test-size 500 \\
        num_people=[3,4,5,6,7]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dataflex_rl.overrides import split_assignment
from dataflex_rl.tasks import Problem, Task
from dataflex_rl.tasks.base import make_config
from dataflex_rl.verl.reward import verl_task, verl_tasks

TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
SPLIT_FILES = (("train", TRAIN_FILE), ("test", TEST_FILE))


def verl_row(problem: Problem, data_source: str, split: str, index: int) -> dict[str, Any]:
    """One verl RL dataset row of ``problem`` of the task named ``data_source``: chat messages, ``data_source``,
    ``reward_model.ground_truth`` (JSON string), ``ability`` and ``extra_info``."""
    task_class = verl_task(data_source)
    return {
        "data_source": data_source,
        "prompt": task_class.verl_messages(problem),
        "ability": task_class.verl_ability or task_class.name,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(problem.answer)},
        "extra_info": {"split": split, "index": index, "difficulty": problem.difficulty, "key": problem.key},
    }


def verl_task_instance(task: str, params: Mapping[str, Any] | None = None) -> Task:
    """The task named ``task`` built from ``params`` (unknown or bad params raise ValueError); its held-out pool is
    only built if ``verl_problems`` asks for it."""
    task_class = verl_task(task)
    return task_class(make_config(task_class.name, task_class.config_class, params))


def build_rows(
    task: str, params: Mapping[str, Any] | None, train_size: int, test_size: int, seed: int = 0
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}`` of the task named ``task`` with ``params`` (see the module docstring)."""
    instance = verl_task_instance(task, params)
    problems = instance.verl_problems(train_size, test_size, seed)
    return {
        split: [verl_row(problem, task, split, index) for index, problem in enumerate(problems[split])]
        for split, _ in SPLIT_FILES
    }


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows atomically (temp file, then rename)."""
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    temporary = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(temporary, index=False)
    temporary.replace(path)


def write_files(rows: Mapping[str, list[dict[str, Any]]], out: Path) -> None:
    """``train.parquet`` and ``test.parquet`` in ``out`` (created if missing), one line printed per file."""
    out.mkdir(parents=True, exist_ok=True)
    for split, filename in SPLIT_FILES:
        write_parquet(rows[split], out / filename)
        print(f"{split}: {len(rows[split])} rows -> {out / filename}")


def parse_params(arguments: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` task params, each value read as YAML (``3``, ``[3,4]``, ``chat``); a ValueError otherwise."""
    params: dict[str, Any] = {}
    for argument in arguments:
        key, value = split_assignment(argument)
        if value is None or not key:
            raise ValueError(f"task param {argument!r} is not allowed: write KEY=VALUE, e.g. num_people=[3,4,5]")
        try:
            params[key] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise ValueError(f"task param {key}={value!r} is not valid YAML: {error}") from None
    return params


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dataflex_rl.verl.data``: build the rows (a bad task, param or size stops before any write), then
    write both files."""
    parser = argparse.ArgumentParser(
        prog="python -m dataflex_rl.verl.data", description="Write a task's problems as verl parquet files."
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    parser.add_argument("--task", required=True, help=f"a registered task: {', '.join(verl_tasks())}")
    parser.add_argument("--train-size", type=int, default=1000, help="train rows")
    parser.add_argument("--test-size", type=int, default=100, help="test rows")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train problems and their order")
    parser.add_argument("params", nargs="*", help="task params KEY=VALUE (YAML values)")
    options = parser.parse_args(argv)
    for name in ("train_size", "test_size"):
        if getattr(options, name) < 0:
            parser.error(f"--{name.replace('_', '-')} = {getattr(options, name)} is not allowed: it must be >= 0")
    try:
        rows = build_rows(options.task, parse_params(options.params), options.train_size, options.test_size,
                          seed=options.seed)
    except ValueError as error:
        parser.error(str(error))
    write_files(rows, options.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
