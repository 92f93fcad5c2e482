"""Scorers: turn batch fields into a per-token signal of shape ``(bs, L)``.

A scorer declares what it produces (``granularity``, ``signal``) and what it needs (``required_fields``,
``needs_groups``, ``needs_forward``) so a config can be checked before any training starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import torch

from dataflex_rl.registry import Registry

SCORERS: Registry[type[Scorer]] = Registry("scorer")
register_scorer = SCORERS.register


class Scorer:
    """Base class. Subclasses set the class attributes and implement :meth:`score`."""

    name: ClassVar[str]
    granularity: ClassVar[str] = "token"  # token | sequence | group
    signal: ClassVar[str]  # what the numbers mean, e.g. "token_prob"
    required_fields: ClassVar[tuple[str, ...]] = ()
    needs_groups: ClassVar[bool] = False
    needs_forward: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Params:
        """The scorer's parameters (none); subclasses add fields checked in ``__post_init__``."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def score(self, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Signal ``(bs, L)`` float32; values at positions where ``response_mask`` is 0 are unspecified.

        Must be pure tensor code (no ``.item()``, no raising on values) so the mechanism can fuse it.
        """
        raise NotImplementedError

    def score_given_probs(self, fields: Mapping[str, torch.Tensor], token_probs: torch.Tensor) -> torch.Tensor:
        """:meth:`score`, where the mechanism has already computed ``token_probs`` ``(bs, L)`` (``pi`` on valid
        tokens, 1.0 elsewhere) for its statistics: a scorer whose signal is ``pi`` or a function of it overrides
        this to reuse them instead of a second pass over ``old_log_probs``."""
        return self.score(fields)

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` describing bad input (called only when the mechanism's cheap check fails)."""


@register_scorer("token_prob")
class TokenProbScorer(Scorer):
    """``pi_t = exp(old_log_probs_t)``: the sampling policy's probability of each generated token.

    Uses the log-probs the trainer already computed before the update (no extra forward pass).
    """

    name = "token_prob"
    granularity = "token"
    signal = "token_prob"
    required_fields = ("old_log_probs", "response_mask")

    def score(self, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``exp(old_log_probs)`` on valid tokens, 1.0 at masked positions (whatever they held).

        Pure tensor code (no host sync) so a mechanism can fuse it; :meth:`validate` checks the input.
        """
        response_mask = fields["response_mask"].bool()
        # Masked positions may hold anything (padding, NaN, +inf); replace them before exp so nothing leaks.
        return masked_log_probs(fields["old_log_probs"], response_mask).exp()

    def score_given_probs(self, fields: Mapping[str, torch.Tensor], token_probs: torch.Tensor) -> torch.Tensor:
        """The mechanism's ``token_probs`` are this scorer's signal: returned as they are."""
        return token_probs

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        """Refuse log-probs that are not finite or above 0 on valid tokens, naming counts and positions."""
        check_log_probs(fields["old_log_probs"], fields["response_mask"].bool())


@register_scorer("entropy")
class EntropyScorer(Scorer):
    """``H_t``: the entropy (nats) of the sampling policy's next-token distribution at each generated token.

    Read from the batch field ``entropy``, which both backends fill without another forward pass: verl's V1
    trainer writes it next to ``old_log_probs`` (``calculate_entropy: True``), the local backend takes it from
    the sampler's own logits (or from its old-log-prob pass with ``trainer.recompute_old_log_probs``).
    """

    name = "entropy"
    granularity = "token"
    signal = "entropy"
    required_fields = ("entropy", "response_mask")

    def score(self, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``entropy`` as float32 on valid tokens (a rounding-negative value clamped to 0), 0 elsewhere."""
        return masked_entropy(fields["entropy"], fields["response_mask"].bool())

    def validate(self, fields: Mapping[str, torch.Tensor]) -> None:
        """Refuse entropies that are not finite on valid tokens, naming counts and positions."""
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
    """``log_probs`` as float32 on valid tokens, 0 elsewhere."""
    return torch.where(response_mask, log_probs.float(), 0.0)


def check_log_probs(log_probs: torch.Tensor, response_mask: torch.Tensor, field: str = "old_log_probs") -> None:
    """Raise ``ValueError`` if a valid token's log-prob is non-finite or positive (how many, and where)."""
    bad = response_mask & ~(torch.isfinite(log_probs) & (log_probs <= 0))
    if bool(bad.any()):
        count, first = bad_positions(log_probs, bad)
        raise ValueError(
            f"{field}: {count} valid token(s) have a non-finite or positive log-prob "
            f"(a log-probability must be finite and <= 0); first (row, position) -> value: {first}"
        )
