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

The alternatives to AR on the same hook (``docs/mechanisms.md`` has each paper's formula and settings)::

    sigmoid_reweight   w_t = 2 sigmoid(k (pi_t - tau))                 (the AR paper code's ``both_sigmoid``)
    entropy_quantile   w_t = 1[H_t >= q_{1 - rho}(H)]                  (80/20 high-entropy tokens, arXiv:2506.01939)
    stapo              w_t = 1 - 1[A_t > 0, pi_t < tau_p, H_t < q_{entropy_quantile}(H)], mean-normalised
                                                                        (STAPO, arXiv:2602.15620)
    prob_band          w_t = 1[low <= pi_t < high]  (high = 1: pi_t <= 1) (the AR paper's quartile experiment)

with ``H_t`` the old policy's entropy at token ``t`` (the ``entropy`` scorer) and ``q_p(H)`` the ``p``-quantile of
``H`` over the batch's valid tokens (linear interpolation, as ``torch.quantile``).
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

    ``needs_advantages``: the mechanism passes ``advantages=`` ``(bs, L)`` to :meth:`weights` (for weights that
    depend on the advantage's sign); ``needs_token_probs``: it passes ``token_probs=`` ``(bs, L)`` (``pi`` on valid
    tokens, 1.0 elsewhere; for a rule that reads ``pi`` beside another scorer's signal); otherwise it calls
    ``weights(signal, response_mask)``.
    ``needs_stages``: only a mechanism that splits the update in stages can drive this actuator.
    """

    name: ClassVar[str]
    granularities: ClassVar[frozenset[str]] = frozenset({"token"})
    signals: ClassVar[frozenset[str]] = frozenset()
    needs_advantages: ClassVar[bool] = False
    needs_token_probs: ClassVar[bool] = False
    needs_stages: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Params:
        """The actuator's parameters (none); subclasses add fields checked in ``__post_init__``."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """Weights ``(bs, L)`` float32, >= 0, 0 at masked positions, from ``signal`` ``(bs, L)``, boolean
        ``response_mask`` ``(bs, L)`` and, for an actuator that asks for them, the advantages and ``pi`` ``(bs, L)``.

        Pure tensor code (no host sync), so the mechanism can fuse it."""
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

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
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


@register_actuator("sigmoid_reweight")
class SigmoidReweight(Actuator):
    """``w = 2 sigmoid(k (pi - tau))``: the AR paper code's ``both_sigmoid`` weights, a smooth step around ``tau``
    (``pi`` below ``tau`` damped towards 0, above it raised towards 2), optionally mean-normalised like AR's.
    ``k = 0`` gives exactly 1.0 on every valid token (the baseline)."""

    name = "sigmoid_reweight"
    signals = frozenset({"token_prob"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        """``dataflex.actuator.params`` of ``sigmoid_reweight``."""
        k: float = 5.0
        tau: float = 0.5
        normalize: str = "mean"

        def __post_init__(self) -> None:
            object.__setattr__(self, "k", check_number("k", self.k, minimum=0.0))
            object.__setattr__(self, "tau", check_unit_interval("tau", self.tau))
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """``2 sigmoid(k (s - tau))`` on valid tokens, 0 elsewhere, mean-normalised unless ``normalize: none``."""
        params = self.params
        raw = torch.where(response_mask, 2.0 * torch.sigmoid(params.k * (signal.float() - params.tau)), 0.0)
        return raw if params.normalize == "none" else masked_mean_normalize(raw, response_mask)


@register_actuator("entropy_quantile")
class EntropyQuantileMask(Actuator):
    """The 80/20 rule of arXiv:2506.01939: keep the policy-gradient term only on the batch's high-entropy tokens.

    ``w = 1`` where ``H >= q``, ``q`` the ``(1 - rho)``-quantile of ``H`` over the batch's valid tokens (linear
    interpolation, as TRL's ``top_entropy_quantile`` with ``torch.quantile``), else 0. Ties at ``q`` are all kept
    (``>=``, as TRL), so the kept share can exceed ``rho``. ``normalize: none`` (the default, as the paper and TRL:
    the loss stays normalised over all response tokens) or ``mean`` (the kept tokens' weights are scaled so the
    mean weight over valid tokens is 1: the loss is normalised over the kept tokens only).
    """

    name = "entropy_quantile"
    signals = frozenset({"entropy"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        """``dataflex.actuator.params`` of ``entropy_quantile``."""
        rho: float = 0.2
        normalize: str = "none"

        def __post_init__(self) -> None:
            rho = check_unit_interval("rho", self.rho)
            if rho == 0.0:
                raise ConfigError("rho = 0.0 is not allowed: it must be in (0, 1] (the share of tokens kept; "
                                  "0 would keep only the batch's maximum-entropy tokens)")
            object.__setattr__(self, "rho", rho)
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """1.0 on valid tokens whose entropy is at least the batch's ``(1 - rho)``-quantile, 0 elsewhere."""
        entropy = signal.float()
        threshold = masked_quantile_tensor(entropy, response_mask, 1.0 - self.params.rho)
        kept = (response_mask & (entropy >= threshold)).float()
        return kept if self.params.normalize == "none" else masked_mean_normalize(kept, response_mask)


@register_actuator("stapo")
class SpuriousTokenMask(Actuator):
    """STAPO's silencing of spurious tokens (arXiv:2602.15620): drop the tokens that are positive-advantage,
    improbable (``pi < tau_p``) and confident (``H < tau_h``), then renormalise over the remaining tokens.

    ``tau_h`` is the ``entropy_quantile``-quantile of ``H`` over the batch's valid tokens (the paper's examples:
    ``tau_p = 0.01``, ``tau_h`` the 5th percentile). Weights: 1 on kept valid tokens, 0 on dropped ones, divided by
    the kept share (the mean over valid tokens is 1, so a token-mean loss averages over the kept tokens). Every
    comparison is strict, so a token exactly at ``tau_p`` or ``tau_h`` is kept. All valid tokens dropped: all 0.
    """

    name = "stapo"
    signals = frozenset({"entropy"})
    needs_advantages = True
    needs_token_probs = True

    @dataclasses.dataclass(frozen=True)
    class Params:
        """``dataflex.actuator.params`` of ``stapo``."""
        tau_p: float = 0.01
        entropy_quantile: float = 0.05

        def __post_init__(self) -> None:
            object.__setattr__(self, "tau_p", check_unit_interval("tau_p", self.tau_p))
            object.__setattr__(self, "entropy_quantile", check_unit_interval("entropy_quantile",
                                                                             self.entropy_quantile))

    def spurious(self, entropy: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor,
                 token_probs: torch.Tensor) -> torch.Tensor:
        """Boolean ``(bs, L)``: the valid tokens STAPO silences."""
        entropy = entropy.float()
        tau_h = masked_quantile_tensor(entropy, response_mask, self.params.entropy_quantile)
        return response_mask & (advantages > 0) & (token_probs < self.params.tau_p) & (entropy < tau_h)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """The kept valid tokens' mask, mean-normalised over valid tokens (see the class docstring)."""
        if advantages is None or token_probs is None:
            raise ValueError(f"{self.name}: weights need the advantages and the token probabilities")
        kept = (response_mask & ~self.spurious(signal, response_mask, advantages, token_probs)).float()
        return masked_mean_normalize(kept, response_mask)


@register_actuator("prob_band")
class ProbabilityBand(Actuator):
    """The AR paper's quartile experiment: keep the advantages of the tokens whose ``pi`` lies in ``[low, high)``
    (``high = 1`` closed, as the gradient statistics' buckets) and zero the rest, so that only one probability band
    updates the policy (the authors' ``mask_prob_interval1``-``4`` and ``mask_prob_lower*`` variants, whose bands
    are ``(low, high]``: the two differ only for a token exactly at an edge).

    ``normalize: none`` (the default, as theirs: the loss stays normalised over all response tokens) or ``mean``.
    """

    name = "prob_band"
    signals = frozenset({"token_prob"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        """``dataflex.actuator.params`` of ``prob_band``."""
        low: float = 0.0
        high: float = 0.25
        normalize: str = "none"

        def __post_init__(self) -> None:
            object.__setattr__(self, "low", check_unit_interval("low", self.low))
            object.__setattr__(self, "high", check_unit_interval("high", self.high))
            if self.low >= self.high:
                raise ConfigError(f"high = {self.high!r} is not allowed with low = {self.low!r}: the band [low, high) "
                                  f"needs low < high (both in [0, 1])")
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """1.0 on valid tokens with ``low <= pi < high`` (``pi <= 1`` when ``high = 1``), 0 elsewhere."""
        probs = signal.float()
        below_high = probs <= self.params.high if self.params.high == 1.0 else probs < self.params.high
        kept = (response_mask & (probs >= self.params.low) & below_high).float()
        return kept if self.params.normalize == "none" else masked_mean_normalize(kept, response_mask)


def masked_mean_normalize(weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``weights / mean(weights[response_mask])``; all zeros (no NaN) when no token is valid or every weight is 0.

    ``weights`` must already be 0 at masked positions. No host sync, so it fuses under ``torch.compile``. A sum of
    up to 2**24 ones is exact in float32 in any order, so weights that are all 1.0 stay exactly 1.0 (alpha = 0).
    """
    count = response_mask.sum()
    total = weights.sum(dtype=torch.float64) if response_mask.numel() > 2**24 else weights.sum()
    mean = torch.where(total > 0, total / count.clamp(min=1), 1.0).to(weights.dtype)
    return weights / mean


def masked_quantile_tensor(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q``-quantile of ``values[mask]`` as a 0-d tensor, computed as ``torch.quantile`` (``interpolation=
    'linear'``) does: sort, then ``lerp(sorted[floor(r)], sorted[ceil(r)], r - floor(r))`` with ``r = q (n - 1)``
    in the values' dtype, without its limit of 2**24 elements. 0.0 when no element is selected.

    Unselected positions sort last (as +inf), so no data-dependent shape and no host sync: it fuses.
    """
    if values.numel() == 0:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    ordered = torch.where(mask, values, float("inf")).reshape(-1).sort().values
    count = mask.sum()
    # torch.full, not torch.tensor: a tensor built from Python data is copied to the device, which waits for it.
    rank = torch.full((1,), q, dtype=ordered.dtype, device=ordered.device) * (count - 1).clamp(min=0).to(ordered.dtype)
    below = rank.floor()
    # Indexed with 1-element tensors: a 0-d index tensor is read on the host (.item()) by torch's indexing.
    value = torch.lerp(ordered[below.long()], ordered[rank.ceil().long()], rank - below).reshape(())
    return torch.where(count > 0, value, torch.zeros((), dtype=ordered.dtype, device=ordered.device))


def masked_quantile(values: torch.Tensor, mask: torch.Tensor, q: float) -> float:
    """:func:`masked_quantile_tensor` as a Python float (one host sync)."""
    return float(masked_quantile_tensor(values, mask, q))
