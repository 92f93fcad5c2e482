"""Write Knights-and-Knaves puzzles as verl RL dataset parquet files (``train.parquet``, ``test.parquet``).

    python -m dataflex_rl.tasks.prepare_verl --out DIR [--people 3 4 5 6 7] [--train-per-difficulty 1000]
        [--test-per-difficulty 100] [--seed 0] [--test-seed 12345]

Each row is :func:`dataflex_rl.tasks.reward_fn.verl_row` of a chat-rendered puzzle, the columns verl's
``RLHFDataset`` reads: ``prompt`` (system and user chat messages; verl applies the model's chat template),
``data_source`` (``knights_knaves``, which selects the reward in ``compute_score``), ``reward_model.ground_truth``
(the puzzle as JSON), ``extra_info`` (``split``, ``index``, ``difficulty`` = number of people, ``key``) and
``ability``. As in arXiv:2505.12929 (and Logic-RL), training mixes puzzles of 3 to 7 people in equal numbers.

Train and test are disjoint: the test puzzles of each difficulty are drawn first from ``--test-seed`` and every
train puzzle with the same key (the puzzle up to names) is excluded; within a split no puzzle repeats. The test
puzzles of a difficulty are the first ones the local backend's ``knights_knaves`` task draws for its test pool
with the same ``test_seed`` (both call ``generate_puzzles(count, people, test_seed)``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dataflex_rl.tasks.knights_knaves import (
    MAX_PEOPLE,
    MIN_PEOPLE,
    TASK_NAME,
    KnightsKnavesConfig,
    KnightsKnavesTask,
    generate_puzzles,
)
from dataflex_rl.tasks.reward_fn import verl_row

DEFAULT_PEOPLE = (3, 4, 5, 6, 7)
TRAIN_FILE = "train.parquet"
TEST_FILE = "test.parquet"
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def build_rows(
    people: Sequence[int],
    train_per_difficulty: int,
    test_per_difficulty: int,
    seed: int = 0,
    test_seed: int = 12345,
    max_depth: int = 2,
    max_width: int = 2,
) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, "test": rows}``; train rows shuffled by ``seed``, test rows interleaved by difficulty."""
    config = KnightsKnavesConfig(
        num_people=list(people), rendering="chat", reward="logic_rl", max_depth=max_depth, max_width=max_width
    )
    task = KnightsKnavesTask(config)
    train_problems, test_by_difficulty = [], []
    for num_people in config.people_counts:
        test_puzzles = generate_puzzles(
            test_per_difficulty, num_people, test_seed, max_depth=max_depth, max_width=max_width
        )
        train_puzzles = generate_puzzles(
            train_per_difficulty,
            num_people,
            seed,
            max_depth=max_depth,
            max_width=max_width,
            exclude=[puzzle.key for puzzle in test_puzzles],
        )
        test_by_difficulty.append([task.make_problem(puzzle) for puzzle in test_puzzles])
        train_problems.extend(task.make_problem(puzzle) for puzzle in train_puzzles)
    random.Random(f"{TASK_NAME}/verl-train-order/{seed}").shuffle(train_problems)
    # Interleaved, so every prefix of the test file (verl's data.val_max_samples) mixes the difficulties.
    test_problems = [
        problems[row] for row in range(test_per_difficulty) for problems in test_by_difficulty if row < len(problems)
    ]
    return {
        "train": [verl_row(problem, TASK_NAME, "train", index) for index, problem in enumerate(train_problems)],
        "test": [verl_row(problem, TASK_NAME, "test", index) for index, problem in enumerate(test_problems)],
    }


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows atomically (temp file, then rename)."""
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    temporary = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(temporary, index=False)
    temporary.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dataflex_rl.tasks.prepare_verl", description="Write K&K puzzles as verl parquet files."
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    parser.add_argument(
        "--people", type=int, nargs="+", default=list(DEFAULT_PEOPLE), help="numbers of people (difficulties)"
    )
    parser.add_argument("--train-per-difficulty", type=int, default=1000)
    parser.add_argument("--test-per-difficulty", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="seed of the train puzzles and their order")
    parser.add_argument("--test-seed", type=int, default=12345, help="seed of the test puzzles")
    parser.add_argument("--max-depth", type=int, default=2)
    parser.add_argument("--max-width", type=int, default=2)
    options = parser.parse_args(argv)
    for name in ("train_per_difficulty", "test_per_difficulty"):
        if getattr(options, name) < 0:
            parser.error(f"--{name.replace('_', '-')} = {getattr(options, name)} is not allowed: it must be >= 0")
    if any(not MIN_PEOPLE <= count <= MAX_PEOPLE for count in options.people):
        parser.error(f"--people = {options.people} is not allowed: each must be in [{MIN_PEOPLE}, {MAX_PEOPLE}]")
    try:
        rows = build_rows(
            options.people,
            options.train_per_difficulty,
            options.test_per_difficulty,
            seed=options.seed,
            test_seed=options.test_seed,
            max_depth=options.max_depth,
            max_width=options.max_width,
        )
    except ValueError as error:
        parser.error(str(error))
    options.out.mkdir(parents=True, exist_ok=True)
    for split, filename in (("train", TRAIN_FILE), ("test", TEST_FILE)):
        write_parquet(rows[split], options.out / filename)
        print(f"{split}: {len(rows[split])} rows -> {options.out / filename}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
