"""Kept for old verl commands (``reward.custom_reward_function.path=pkg://dataflex_rl.tasks.reward_fn``): the reward
function and the row builder now live with the verl backend, :mod:`dataflex_rl.verl.reward` and
:mod:`dataflex_rl.verl.data`, and dispatch through the task registry."""

from dataflex_rl.verl.data import verl_row
from dataflex_rl.verl.reward import compute_score

__all__ = ["compute_score", "verl_row"]
