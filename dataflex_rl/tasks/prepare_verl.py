"""The paper's Knights-and-Knaves verl files, in the older spelling (kept for old commands)::

    python -m dataflex_rl.tasks.prepare_verl --out DIR [--people 3 4 5 6 7] [--train-per-difficulty 1000]
        [--test-per-difficulty 100] [--seed 0] [--test-seed 12345] [--max-depth 2] [--max-width 2]

The same as ``python -m dataflex_rl.verl.data --task knights_knaves`` with ``num_people`` = the people,
``--train-size``/``--test-size`` = the per-difficulty counts times the number of difficulties, and the chat rendering
with the ``logic_rl`` reward (:mod:`dataflex_rl.verl.data` writes the files; ``KnightsKnavesTask.verl_problems``
chooses the puzzles: per difficulty, test puzzles from ``--test-seed`` first, train puzzles disjoint from them).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.tasks.knights_knaves import MAX_PEOPLE, MIN_PEOPLE, TASK_NAME
from dataflex_rl.verl.data import COLUMNS, TEST_FILE, TRAIN_FILE, write_files, write_parquet
from dataflex_rl.verl.data import build_rows as build_task_rows

__all__ = ["COLUMNS", "TEST_FILE", "TRAIN_FILE", "build_rows", "main", "write_parquet"]
DEFAULT_PEOPLE = (3, 4, 5, 6, 7)


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
    params = {"num_people": list(people), "rendering": "chat", "reward": "logic_rl", "max_depth": max_depth,
              "max_width": max_width, "test_seed": test_seed}
    return build_task_rows(TASK_NAME, params, train_per_difficulty * len(people), test_per_difficulty * len(people),
                           seed=seed)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dataflex_rl.tasks.prepare_verl``: check the arguments, build every row, then write both files."""
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
        rows = build_rows(options.people, options.train_per_difficulty, options.test_per_difficulty,
                          seed=options.seed, test_seed=options.test_seed, max_depth=options.max_depth,
                          max_width=options.max_width)
    except ValueError as error:
        parser.error(str(error))
    write_files(rows, options.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
