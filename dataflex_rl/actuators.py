"""Actuators: a scorer's signal -> per-token weights ``(bs, L)``, 0 at masked positions (AR, Lopti and the rules
beside them; each formula and its paper: docs/mechanisms.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

import dataflex_rl.keys as keys
from dataflex_rl.registry import Registry
from dataflex_rl.validation import ConfigError, check_choice, check_number, check_unit_interval

ACTUATORS: Registry[type[Actuator]] = Registry("actuator")

NORMALIZE_CHOICES = ("mean", "none")
# Lopti's split: pi < |eta| (the paper code's ``seperate_prob``) or below the |eta|-quantile (``seperate_portion``).
SPLIT_CHOICES = ("threshold", "quantile")


class Actuator:
    """Base class: subclasses set the class attributes and implement :meth:`weights`."""

    name: ClassVar[str]  # set by the registry
    signals: ClassVar[frozenset[str]] = frozenset()
    staged: ClassVar[bool] = False

    @dataclasses.dataclass(frozen=True)
    class Params:
        """The actuator's parameters (none); subclasses add fields checked in ``__post_init__``."""

    def __init__(self, params: Params | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        """``(bs, L)`` float32 weights, >= 0, 0 at masked positions, from the ``(bs, L)`` signal, bool mask,
        advantages and ``pi``: one of the pure functions below with this actuator's params (no host sync)."""
        raise NotImplementedError

    def stages(self, token_probs: torch.Tensor, response_mask: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        raise NotImplementedError

    def stage_metrics(self, statistics: list[float], valid_tokens: float) -> dict[str, float]:
        """The step's metrics from :meth:`stages`' statistics, read on the host."""
        raise NotImplementedError


@ACTUATORS.register("advantage_reweight")
class AdvantageReweight(Actuator):
    """``w = alpha * pi + tau`` (``tau``: ``1 - alpha`` by default), optionally mean-normalised, x neg_adv_weight."""

    signals = frozenset({"token_prob"})

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
        params = self.params
        return advantage_reweight_weights(signal, response_mask, alpha=params.alpha, tau=params.effective_tau,
                                          normalize=params.normalize, neg_adv_weight=params.neg_adv_weight,
                                          advantages=advantages)


@ACTUATORS.register("lopti")
class LoptiReweight(AdvantageReweight):
    """Low-Probability Token Isolation (Lopti, arXiv:2505.12929), with AR's weights inside (off by default)."""

    staged = True

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

    def stages(self, token_probs: torch.Tensor, response_mask: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``[first, second]`` masks, and ``[tokens in the low group]`` with, for the quantile split, ``t``."""
        # The low group is pi < t: t = |eta|, or the |eta|-quantile of pi as a 0-d tensor on the batch's device.
        threshold = abs(self.params.eta)
        if self.params.split == "quantile":
            threshold = masked_quantile_tensor(token_probs, response_mask & (token_probs > 0), threshold)
        low = response_mask & (token_probs < threshold)
        high = response_mask & ~low
        statistics = [low.sum().double().reshape(1)]
        if isinstance(threshold, torch.Tensor):
            statistics.append(threshold.double().reshape(1))
        return ([low, high] if self.params.eta > 0 else [high, low]), torch.cat(statistics)

    def stage_metrics(self, statistics: list[float], valid_tokens: float) -> dict[str, float]:
        """The low group's share of the valid tokens and the split's threshold ``t``."""
        low_count, *threshold = statistics
        return {keys.LOPTI_LOW_TOKEN_FRAC: low_count / valid_tokens if valid_tokens else 0.0,
                keys.LOPTI_THRESHOLD: threshold[0] if threshold else abs(self.params.eta)}


@ACTUATORS.register("sigmoid_reweight")
class SigmoidReweight(Actuator):
    """``w = 2 sigmoid(k (pi - tau))``."""

    signals = frozenset({"token_prob"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        k: float = 5.0
        tau: float = 0.5
        normalize: str = "mean"

        def __post_init__(self) -> None:
            object.__setattr__(self, "k", check_number("k", self.k, minimum=0.0))
            object.__setattr__(self, "tau", check_unit_interval("tau", self.tau))
            check_choice("normalize", self.normalize, NORMALIZE_CHOICES)

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        return sigmoid_weights(signal, response_mask, k=self.params.k, tau=self.params.tau,
                               normalize=self.params.normalize)


@ACTUATORS.register("entropy_quantile")
class EntropyQuantileMask(Actuator):
    """The 80/20 rule of arXiv:2506.01939."""

    signals = frozenset({"entropy"})

    @dataclasses.dataclass(frozen=True)
    class Params:
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
        return high_entropy_weights(signal, response_mask, rho=self.params.rho, normalize=self.params.normalize)


@ACTUATORS.register("stapo")
class SpuriousTokenMask(Actuator):
    """STAPO (arXiv:2602.15620): drop positive-advantage tokens with ``pi < tau_p`` and ``H < tau_h``."""

    signals = frozenset({"entropy"})

    @dataclasses.dataclass(frozen=True)
    class Params:
        tau_p: float = 0.01
        entropy_quantile: float = 0.05

        def __post_init__(self) -> None:
            object.__setattr__(self, "tau_p", check_unit_interval("tau_p", self.tau_p))
            object.__setattr__(self, "entropy_quantile", check_unit_interval("entropy_quantile", self.entropy_quantile))

    def weights(self, signal: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor | None = None,
                token_probs: torch.Tensor | None = None) -> torch.Tensor:
        if advantages is None or token_probs is None:
            raise ValueError(f"{self.name}: weights need the advantages and the token probabilities")
        return stapo_weights(signal, response_mask, advantages, token_probs, tau_p=self.params.tau_p,
                             entropy_quantile=self.params.entropy_quantile)


@ACTUATORS.register("prob_band")
class ProbabilityBand(Actuator):
    """The AR paper's quartile experiment."""

    signals = frozenset({"token_prob"})

    @dataclasses.dataclass(frozen=True)
    class Params:
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
        return band_weights(signal, response_mask, low=self.params.low, high=self.params.high,
                            normalize=self.params.normalize)


# --- the rules as pure functions of (bs, L) tensors: probs/signal float, response_mask bool; each returns (bs, L)
# float32 weights, >= 0 and 0 at masked positions, without a host synchronisation ---------------------------------
def advantage_reweight_weights(token_probs: torch.Tensor, response_mask: torch.Tensor, *, alpha: float, tau: float,
                               normalize: str = "mean", neg_adv_weight: float = 1.0,
                               advantages: torch.Tensor | None = None) -> torch.Tensor:
    """AR: ``w = alpha * pi + tau``, divided by its mean over valid tokens (``normalize="mean"``), times
    ``neg_adv_weight`` where the advantage is negative. alpha = 0, tau = 1 gives exactly 1.0 on valid tokens."""
    raw = torch.where(response_mask, token_probs.float() * alpha + tau, 0.0)
    weights = raw if normalize == "none" else masked_mean_normalize(raw, response_mask)
    if neg_adv_weight == 1.0:  # the default: nothing to do, so alpha = 0 stays exactly 1.0
        return weights
    if advantages is None:
        raise ValueError(f"advantage_reweight: neg_adv_weight = {neg_adv_weight} needs the advantages")
    return torch.where(advantages < 0, weights * neg_adv_weight, weights)


def sigmoid_weights(token_probs: torch.Tensor, response_mask: torch.Tensor, *, k: float, tau: float,
                    normalize: str = "mean") -> torch.Tensor:
    """The AR paper code's ``w = 2 sigmoid(k (pi - tau))``, optionally mean-normalised."""
    raw = torch.where(response_mask, 2.0 * torch.sigmoid(k * (token_probs.float() - tau)), 0.0)
    return raw if normalize == "none" else masked_mean_normalize(raw, response_mask)


def high_entropy_weights(entropy: torch.Tensor, response_mask: torch.Tensor, *, rho: float,
                         normalize: str = "none") -> torch.Tensor:
    """The 80/20 rule: 1 on the share ``rho`` of valid tokens with the highest entropy, else 0."""
    threshold = masked_quantile_tensor(entropy.float(), response_mask, 1.0 - rho)
    kept = (response_mask & (entropy.float() >= threshold)).float()
    return kept if normalize == "none" else masked_mean_normalize(kept, response_mask)


def stapo_weights(entropy: torch.Tensor, response_mask: torch.Tensor, advantages: torch.Tensor,
                  token_probs: torch.Tensor, *, tau_p: float, entropy_quantile: float) -> torch.Tensor:
    """STAPO: 0 on positive-advantage tokens with ``pi < tau_p`` and entropy below its ``entropy_quantile``,
    1 elsewhere, mean-normalised."""
    tau_h = masked_quantile_tensor(entropy.float(), response_mask, entropy_quantile)
    spurious = (advantages > 0) & (token_probs < tau_p) & (entropy.float() < tau_h)
    return masked_mean_normalize((response_mask & ~spurious).float(), response_mask)


def band_weights(token_probs: torch.Tensor, response_mask: torch.Tensor, *, low: float, high: float,
                 normalize: str = "none") -> torch.Tensor:
    """1 on valid tokens with ``low <= pi < high`` (``<= 1`` for the last band), else 0."""
    probs = token_probs.float()
    below_high = probs <= high if high == 1.0 else probs < high
    kept = (response_mask & (probs >= low) & below_high).float()
    return kept if normalize == "none" else masked_mean_normalize(kept, response_mask)


def masked_mean_normalize(weights: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``weights / mean(weights[response_mask])`` (``weights`` 0 at masked positions)."""
    count = response_mask.sum()
    total = weights.sum(dtype=torch.float64) if response_mask.numel() > 2**24 else weights.sum()
    mean = torch.where(total > 0, total / count.clamp(min=1), 1.0).to(weights.dtype)
    return weights / mean


def masked_quantile_tensor(values: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile`` (linear) of ``values[mask]`` without its 2**24 limit or a host sync (0.0 when empty)."""
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

