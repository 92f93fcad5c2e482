"""Problem generators, answer parsers and rewards (no torch), each with its verl hooks:
``build_task("arithmetic", {"max_digits": 2})``."""

from dataflex_rl.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from dataflex_rl.tasks.base import TASKS, Problem, Task, build_task
from dataflex_rl.tasks.knights_knaves import KnightsKnavesConfig, KnightsKnavesTask, Puzzle, generate_puzzles, solve
from dataflex_rl.tasks.long_addition import LongAdditionConfig, LongAdditionTask

__all__ = ["TASKS", "ArithmeticConfig", "ArithmeticTask", "KnightsKnavesConfig", "KnightsKnavesTask",
           "LongAdditionConfig", "LongAdditionTask", "Problem", "Puzzle", "Task", "build_task", "generate_puzzles",
           "solve"]
