"""Actuators: turn a scorer's signal into per-token weights ``(bs, L)``.

``advantage_reweight`` implements Advantage Reweighting (arXiv:2505.12929)::

    w_t = alpha * pi_t + (1 - alpha)                      (raw, normalize: none)
    w_t = w_t / mean_{valid tokens of the batch}(w)       (normalize: mean, the default)

Weights are 0 at masked positions. ``alpha = 0`` gives exactly 1.0 on valid tokens.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from dataflex_rl.config import check_choice, check_unit_interval
from dataflex_rl.registry import Registry

ACTUATORS: Registry[type[Actuator]] = Registry("actuator")
register_actuator = ACTUATORS.register

NORMALIZE_CHOICES = ("mean", "none")


class Actuator:
    """Base class. Subclasses set the class attributes and implement :meth:`weights`."""

    name: ClassVar[str]
    granularities: ClassVar[frozenset[str]] = frozenset({"token"})
    signals: ClassVar[frozenset[str]] = frozenset()

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """Weights ``(bs, L)`` float32 from ``signal`` ``(bs, L)`` and boolean ``response_mask`` ``(bs, L)``."""
        raise NotImplementedError


@register_actuator("advantage_reweight")
class AdvantageReweight(Actuator):
    """``w = alpha * pi + (1 - alpha)``, optionally divided by its mean over the batch's valid tokens."""

    name = "advantage_reweight"
    signals = frozenset({"token_prob"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        alpha: float = 0.5
        normalize: str = "mean"

        def __post_init__(self) -> None:
            object.__setattr__(self, "alpha", check_unit_interval("alpha", self.alpha))
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        alpha = self.params.alpha
        raw = torch.where(response_mask, signal.float() * alpha + (1.0 - alpha), 0.0)
        if self.params.normalize == "none":
            return raw
        return masked_mean_normalize(raw, response_mask)


def masked_mean_normalize(weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``weights / mean(weights[response_mask])``; all zeros (no NaN) when no token is valid.

    ``weights`` must already be 0 at masked positions. No host sync, so it fuses under ``torch.compile``. A sum of
    up to 2**24 ones is exact in float32 in any order, so weights that are all 1.0 stay exactly 1.0 (alpha = 0).
    """
    count = response_mask.sum()
    total = weights.sum(dtype=torch.float64) if response_mask.numel() > 2**24 else weights.sum()
    mean = torch.where(count > 0, total / count.clamp(min=1), 1.0).to(weights.dtype)
    return weights / mean
