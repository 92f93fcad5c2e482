"""Problem generators, answer parsers and rewards (no torch).

>>> from dataflex_rl.tasks import build_task
>>> task = build_task("arithmetic", {"max_digits": 2})
>>> problem = task.train_problems(1, seed=0)[0]
>>> task.reward(problem, problem.completion)
1.0

Registered tasks: ``arithmetic`` (:mod:`.arithmetic`) and ``knights_knaves`` (:mod:`.knights_knaves`). Each also
gives the verl hooks (``verl_score``, ``verl_messages``, ...; see :mod:`.base`) through which the verl backend's
reward function (:mod:`dataflex_rl.verl.reward`) and data files (:mod:`dataflex_rl.verl.data`) serve it.
"""

from dataflex_rl.tasks import arithmetic, knights_knaves  # noqa: F401  (registers the tasks)
from dataflex_rl.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from dataflex_rl.tasks.base import TASKS, Problem, Task, build_task
from dataflex_rl.tasks.knights_knaves import KnightsKnavesConfig, KnightsKnavesTask, Puzzle, generate_puzzles, solve

__all__ = [
    "TASKS",
    "ArithmeticConfig",
    "ArithmeticTask",
    "KnightsKnavesConfig",
    "KnightsKnavesTask",
    "Problem",
    "Puzzle",
    "Task",
    "build_task",
    "generate_puzzles",
    "solve",
]
