"""Actuators: turn a scorer's signal into per-token weights ``(bs, L)``.

``advantage_reweight`` implements Advantage Reweighting (arXiv:2505.12929)::

    w_t = alpha * pi_t + tau                              (raw, normalize: none; tau defaults to 1 - alpha)
    w_t = w_t / mean_{valid tokens of the batch}(w)       (normalize: mean, the default)
    w_t = w_t * neg_adv_weight   where A_t < 0            (neg_adv_weight defaults to 1: no change)

Weights are 0 at masked positions. ``alpha = 0`` (with the defaults) gives exactly 1.0 on valid tokens. With
``normalize: none``, ``tau: 1 - alpha`` and ``neg_adv_weight: 1`` this is the paper code's ``both_linear_normal``
(``docs/mechanisms.md``).

``lopti`` is the same reweighting plus ``eta``, the probability threshold of Low-Probability Token Isolation; the
``isolate`` mechanism (:mod:`dataflex_rl.mechanism`) reads it to split the policy update in two stages.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from dataflex_rl.validation import ConfigError, check_choice, check_number, check_unit_interval
from dataflex_rl.registry import Registry

ACTUATORS: Registry[type[Actuator]] = Registry("actuator")
register_actuator = ACTUATORS.register

NORMALIZE_CHOICES = ("mean", "none")
# Lopti's split: ``threshold`` (pi < |eta|, the paper code's ``seperate_prob``) or ``quantile`` (pi below the
# |eta|-quantile of the batch's valid token probabilities, so |eta| is a share of tokens: ``seperate_portion``).
SPLIT_CHOICES = ("threshold", "quantile")


class Actuator:
    """Base class. Subclasses set the class attributes and implement :meth:`weights`.

    ``needs_advantages``: the mechanism passes the advantages ``(bs, L)`` to :meth:`weights` (for weights that depend
    on the advantage's sign); otherwise it calls ``weights(signal, response_mask)``.
    ``needs_stages``: only a mechanism that splits the update in stages can drive this actuator.
    """

    name: ClassVar[str]
    granularities: ClassVar[frozenset[str]] = frozenset({"token"})
    signals: ClassVar[frozenset[str]] = frozenset()
    needs_advantages: ClassVar[bool] = False
    needs_stages: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Params:
        """The actuator's parameters (none); subclasses add fields checked in ``__post_init__``."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor,
                advantages: torch.Tensor | None = None) -> torch.Tensor:
        """Weights ``(bs, L)`` float32 from ``signal`` ``(bs, L)``, boolean ``response_mask`` ``(bs, L)`` and, for an
        actuator with ``needs_advantages``, the advantages ``(bs, L)``."""
        raise NotImplementedError


@register_actuator("advantage_reweight")
class AdvantageReweight(Actuator):
    """``w = alpha * pi + tau`` (``tau`` defaults to ``1 - alpha``), optionally divided by its mean over the batch's
    valid tokens, then multiplied by ``neg_adv_weight`` where the advantage is negative."""

    name = "advantage_reweight"
    signals = frozenset({"token_prob"})
    needs_advantages = True

    @dataclasses.dataclass(frozen=True)
    class Params:
        """``dataflex.actuator.params`` of ``advantage_reweight``; ``effective_tau`` fills ``tau``."""
        alpha: float = 0.5
        normalize: str = "mean"
        tau: float | None = None  # None: 1 - alpha
        neg_adv_weight: float = 1.0

        def __post_init__(self) -> None:
            object.__setattr__(self, "alpha", check_unit_interval("alpha", self.alpha))
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)
            if self.tau is not None:
                object.__setattr__(self, "tau", check_number("tau", self.tau, minimum=0.0))
                if self.tau == 0.0 and self.alpha == 0.0:
                    raise ConfigError(
                        "tau = 0.0 is not allowed with alpha = 0.0: every weight would be 0; give tau > 0 or alpha > 0"
                    )
            object.__setattr__(self, "neg_adv_weight", check_number("neg_adv_weight", self.neg_adv_weight, minimum=0.0))

        @property
        def effective_tau(self) -> float:
            """``tau``, or ``1 - alpha`` when it is not given."""
            return 1.0 - self.alpha if self.tau is None else self.tau

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor,
                advantages: torch.Tensor | None = None) -> torch.Tensor:
        """``w_t = alpha * s_t + tau`` on valid tokens (0 elsewhere), mean-normalised unless ``normalize: none``;
        ``neg_adv_weight`` scales the weights of tokens with negative advantages. Shapes ``(bs, L)``."""
        params = self.params
        raw = torch.where(response_mask, signal.float() * params.alpha + params.effective_tau, 0.0)
        weights = raw if params.normalize == "none" else masked_mean_normalize(raw, response_mask)
        if params.neg_adv_weight == 1.0:  # the default: nothing to do, so alpha = 0 stays exactly 1.0
            return weights
        if advantages is None:
            raise ValueError(f"{self.name}: neg_adv_weight = {params.neg_adv_weight} needs the advantages")
        return torch.where(advantages < 0, weights * params.neg_adv_weight, weights)


@register_actuator("lopti")
class LoptiReweight(AdvantageReweight):
    """Advantage Reweighting (off by default: ``alpha = 0``) plus Lopti's ``eta`` and ``split``.

    The ``isolate`` mechanism splits valid tokens into a low-probability group and the rest and updates the policy
    in two stages: the low group first for ``eta > 0``, the rest first for ``eta < 0``. ``split: threshold``: the
    low group is ``pi < |eta|`` (the paper code's ``seperate_prob``); ``split: quantile``: ``pi < q`` with ``q`` the
    ``|eta|``-quantile of the batch's valid token probabilities, so ``|eta|`` is the share of tokens in the low group
    (the paper code's ``seperate_portion``). The weights are :class:`AdvantageReweight`'s, applied inside each stage.
    """

    name = "lopti"
    needs_stages = True

    @dataclasses.dataclass(frozen=True)
    class Params(AdvantageReweight.Params):
        """``dataflex.actuator.params`` of ``lopti``: AR's plus ``eta`` and ``split``."""
        alpha: float = 0.0
        eta: float = 0.5
        split: str = "threshold"

        def __post_init__(self) -> None:
            super().__post_init__()
            check_choice("split", self.split, SPLIT_CHOICES)
            eta = check_number("eta", self.eta)
            if not -1.0 <= eta <= 1.0 or eta == 0.0:
                meaning = "pi < eta" if self.split == "threshold" else "pi below the eta-quantile of pi"
                raise ConfigError(
                    f"eta = {self.eta!r} is not allowed: it must be in [-1, 0) or (0, 1] (eta > 0: tokens with "
                    f"{meaning} update first; eta < 0: the others update first)"
                )
            object.__setattr__(self, "eta", eta)


def masked_mean_normalize(weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``weights / mean(weights[response_mask])``; all zeros (no NaN) when no token is valid.

    ``weights`` must already be 0 at masked positions. No host sync, so it fuses under ``torch.compile``. A sum of
    up to 2**24 ones is exact in float32 in any order, so weights that are all 1.0 stay exactly 1.0 (alpha = 0).
    """
    count = response_mask.sum()
    total = weights.sum(dtype=torch.float64) if response_mask.numel() > 2**24 else weights.sum()
    mean = torch.where(count > 0, total / count.clamp(min=1), 1.0).to(weights.dtype)
    return weights / mean
