"""Scorers: turn batch fields into a per-token signal ``(bs, L)``. A scorer declares its ``signal`` and its
``required_fields``, so a config is checked against the actuator before any training starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import torch

from dataflex_rl.registry import Registry

SCORERS: Registry[type[Scorer]] = Registry("scorer")


class Scorer:
    """Base class. Subclasses set the class attributes and implement :meth:`score` (a pure ``(bs, L)`` function of
    the batch fields and the mechanism's ``token_probs``)."""

    name: ClassVar[str]  # set by the registry
    signal: ClassVar[str]  # what the numbers mean, e.g. "token_prob"
    required_fields: ClassVar[tuple[str, ...]] = ()

    @dataclasses.dataclass(frozen=True)
    class Params:
        """The scorer's parameters (none); subclasses add fields checked in ``__post_init__``."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def score(self, fields: Mapping[str, torch.Tensor], token_probs: torch.Tensor) -> torch.Tensor:
        """Signal ``(bs, L)`` float32, unspecified where ``response_mask`` is 0; ``token_probs``: ``(bs, L)``
        ``exp(old_log_probs)`` on valid tokens, 1.0 elsewhere (computed once a step by the mechanism)."""
        raise NotImplementedError

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` describing bad input (called only when the mechanism's cheap check fails)."""


@SCORERS.register("token_prob")
class TokenProbScorer(Scorer):
    """``pi_t = exp(old_log_probs_t)``: the sampling policy's probability of each generated token."""

    signal = "token_prob"
    required_fields = ("old_log_probs", "response_mask")

    def score(self, fields: Mapping[str, torch.Tensor], token_probs: torch.Tensor) -> torch.Tensor:
        return token_probs

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        check_log_probs(fields["old_log_probs"], fields["response_mask"].bool())


@SCORERS.register("entropy")
class EntropyScorer(Scorer):
    """``H_t``: the sampling policy's entropy (nats) at each generated token, from the batch field ``entropy``."""

    signal = "entropy"
    required_fields = ("entropy", "response_mask")

    def score(self, fields: Mapping[str, torch.Tensor], token_probs: torch.Tensor) -> torch.Tensor:
        return masked_entropy(fields["entropy"], fields["response_mask"].bool())

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        check_finite(fields["entropy"], fields["response_mask"].bool(), "entropy")


def masked_entropy(entropy: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``entropy`` as float32 on valid tokens, clamped at 0 (``-sum p log p`` can round to -1e-7), 0 elsewhere."""
    return torch.where(response_mask, entropy.float().clamp(min=0.0), 0.0)


def check_finite(values: torch.Tensor, response_mask: torch.Tensor, field: str) -> None:
    """Raise ``ValueError`` if a valid token's value of ``field`` is NaN or infinite (how many, and where)."""
    bad = response_mask & ~torch.isfinite(values)
    if bool(bad.any()):
        count, first = bad_positions(values, bad)
        raise ValueError(f"batch field {field!r} has {count} NaN or infinite value(s) on valid tokens; first "
                         f"(row, position) -> value: {first}")


def bad_positions(values: torch.Tensor, bad: torch.Tensor) -> tuple[int, dict[tuple[int, int], float]]:
    """``(how many of bad are True, {(row, position): value} of the first five})`` for an error message."""
    positions = bad.nonzero()
    first = [tuple(int(i) for i in row) for row in positions[:5]]
    return positions.shape[0], {(row, col): float(values[row, col]) for row, col in first}


def masked_log_probs(log_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(response_mask, log_probs.float(), 0.0)


def check_log_probs(log_probs: torch.Tensor, response_mask: torch.Tensor, field: str = "old_log_probs") -> None:
    """Raise ``ValueError`` if a valid token's log-prob is non-finite or positive (how many, and where)."""
    bad = response_mask & ~(torch.isfinite(log_probs) & (log_probs <= 0))
    if bool(bad.any()):
        count, first = bad_positions(log_probs, bad)
        raise ValueError(f"{field}: {count} valid token(s) have a non-finite or positive log-prob "
                         f"(a log-probability must be finite and <= 0); first (row, position) -> value: {first}")
