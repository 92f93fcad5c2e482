"""``python -m dataflex_rl.verl.data``: a registered task's problems as verl RL parquet files (docs/verl.md)."""

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dataflex_rl.overrides import split_assignment
from dataflex_rl.tasks import Problem
from dataflex_rl.tasks.base import make_config
from dataflex_rl.verl.reward import verl_task, verl_tasks

TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
SPLIT_FILES = (("train", TRAIN_FILE), ("test", TEST_FILE))


def verl_row(problem: Problem, data_source: str, split: str, index: int) -> dict[str, Any]:
    task_class = verl_task(data_source)
    return {"data_source": data_source, "prompt": task_class.verl_messages(problem),
            "ability": task_class.verl_ability or task_class.name,
            "reward_model": {"style": "rule", "ground_truth": json.dumps(problem.answer)},
            "extra_info": {"split": split, "index": index, "difficulty": problem.difficulty, "key": problem.key}}


def build_rows(task: str, params: Mapping[str, Any] | None, train_size: int, test_size: int,
               seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    task_class = verl_task(task)
    problems = task_class(make_config(task_class.name, task_class.config_class, params)).verl_problems(
        train_size, test_size, seed)
    return {split: [verl_row(problem, task, split, index) for index, problem in enumerate(problems[split])]
            for split, _ in SPLIT_FILES}


def write_files(rows: Mapping[str, list[dict[str, Any]]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, filename in SPLIT_FILES:
        temporary = out / f".{filename}.tmp"
        pd.DataFrame(rows[split], columns=list(COLUMNS)).to_parquet(temporary, index=False)
        temporary.replace(out / filename)
        print(f"{split}: {len(rows[split])} rows -> {out / filename}")


def parse_params(arguments: Sequence[str]) -> dict[str, Any]:
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
    parser = argparse.ArgumentParser(prog="python -m dataflex_rl.verl.data",
                                     description="Write a task's problems as verl parquet files.")
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
