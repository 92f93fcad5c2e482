"""Mechanisms: what a trainer calls once per step, after advantages and before the policy update.

A mechanism composes a scorer (fields -> signal) and an actuator (signal, mask -> weights) and applies the
weights to the advantages. Trainers call :meth:`Mechanism.apply` (or :meth:`Mechanism.process` for the
weights, histograms and update stages too) and never branch on mechanism names. A mechanism is built from a
validated ``dataflex`` block by :func:`dataflex_rl.config.build_mechanism` (also ``dataflex_rl.build_mechanism``),
which checks the block against the registries here; this module never reads the config schema's module.

Shapes: every field is ``(bs, L)`` over response tokens; ``response_mask`` is 1 on valid tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

import dataflex_rl.keys as keys
import dataflex_rl.metrics as metrics
from dataflex_rl.actuators import ACTUATORS, Actuator, masked_quantile_tensor
from dataflex_rl.registry import Registry
from dataflex_rl.scorers import SCORERS, Scorer, check_log_probs, masked_entropy, masked_log_probs

MECHANISMS: Registry[type[Mechanism]] = Registry("mechanism")
register_mechanism = MECHANISMS.register

Fields = Mapping[str, torch.Tensor]


@dataclasses.dataclass
class MechanismOutput:
    """Everything one mechanism step produced.

    ``advantages``: ``(bs, L)``, input dtype and device; ``weights``: ``(bs, L)`` float32 (``None`` before
    warmup); ``metrics``: scalar ``dataflex/...`` metrics; ``histograms``: name -> :class:`metrics.Histogram`
    (only when asked for); ``stage_masks``: boolean ``(bs, L)`` masks, one per policy-update stage, in order
    (``None``: a single update over all tokens).
    """

    advantages: torch.Tensor
    weights: torch.Tensor | None
    metrics: dict[str, float]
    histograms: dict[str, metrics.Histogram] = dataclasses.field(default_factory=dict)
    stage_masks: list[torch.Tensor] | None = None


@dataclasses.dataclass
class DeviceStep:
    """One step on the batch's device, before its one host read: :class:`MechanismOutput`'s tensors,
    ``token_probs`` (``pi`` on valid tokens, 1.0 elsewhere) and ``statistics`` (name -> tensor, read together by
    :func:`metrics.read_on_host`), of which ``histogram_names`` are histogram counts."""

    advantages: torch.Tensor
    weights: torch.Tensor | None
    token_probs: torch.Tensor
    stage_masks: list[torch.Tensor] | None
    statistics: dict[str, torch.Tensor]
    histogram_names: tuple[str, ...] = ()


class Mechanism:
    """Base class: scorer + actuator, active from ``warmup_step`` on."""

    name: ClassVar[str]
    default_scorer: ClassVar[str] = "token_prob"
    default_actuator: ClassVar[str] = "advantage_reweight"
    # Batch fields every backend hands to a mechanism (verl's names). ``entropy`` is the old policy's entropy per
    # token (verl writes it next to old_log_probs; the local backend takes it from the sampler's logits).
    provided_fields: ClassVar[frozenset[str]] = frozenset({"old_log_probs", "response_mask", "advantages", "entropy"})
    actuators_allowed: ClassVar[tuple[str, ...]] = ("*",)
    # True for a mechanism whose ``stage_masks`` splits the policy update in stages (trainers, the config check and
    # the verl loss read this one attribute).
    staged: ClassVar[bool] = False

    def __init__(self, config: Any, *, compile: bool = False) -> None:
        """``config``: a validated :class:`dataflex_rl.config.DataflexConfig` (its scorer, actuator, warmup_step)."""
        self.config = config
        scorer_cls = SCORERS.get(config.scorer.name)
        actuator_cls = ACTUATORS.get(config.actuator.name)
        self.scorer: Scorer = scorer_cls(config.scorer.make_params(scorer_cls.Params))
        self.actuator: Actuator = actuator_cls(config.actuator.make_params(actuator_cls.Params))
        self.warmup_step = config.warmup_step
        # The scorer's own float fields beside old_log_probs (e.g. entropy): checked for NaN/inf on valid tokens.
        self._checked_fields = tuple(sorted(set(self.scorer.required_fields) - {"old_log_probs", "response_mask"}))
        # torch.compile fuses scoring, weighting, applying and the statistics into a few kernels: on a
        # (512, 4096) batch it brings the mechanism from several passes over memory to about the cost of the bare
        # expression (``make bench``). The first call compiles (seconds), so it pays off on large batches only.
        self._compiled = compile
        self._active_core = torch.compile(self._reweight, dynamic=True) if compile else self._reweight

    @property
    def required_fields(self) -> frozenset[str]:
        """The batch fields :meth:`process` reads: the response mask, advantages, old log-probs and the scorer's
        own (a backend hands over these; ``entropy`` only to a mechanism whose scorer reads it)."""
        return frozenset({"response_mask", "advantages", "old_log_probs", *self.scorer.required_fields})

    def is_active(self, step: int) -> bool:
        """Active from ``warmup_step`` on (``step`` as the trainer counts it; verl's global steps start at 1)."""
        return step >= self.warmup_step

    def process(self, step: int, fields: Fields, *, histograms: bool = False) -> MechanismOutput:
        """Score, weight and apply; also the statistics. Computes in float32, returns the advantages' dtype, on
        the batch's device.

        One host synchronisation per call: the statistics, the value checks, the stage statistics and the
        histograms' counts are computed on the batch's device (:meth:`device_step`) and read in one transfer.
        """
        self._check_fields(fields)
        step_output = self.device_step(step, fields, histograms=histograms)
        values = metrics.read_on_host(step_output.statistics)  # the step's one host synchronisation
        response_mask = fields["response_mask"].bool()
        bad_mask_values, bad_advantages = values["faults"]
        if bad_mask_values or bad_advantages:
            raise_input_faults(fields, response_mask, int(bad_mask_values), int(bad_advantages))
        if any(values["field_faults"]):
            self.scorer.validate(fields)  # raises naming the field, counts and positions
        token_values = values["tokens"]
        log_prob_sum, log_prob_max = token_values[:2]
        if not math.isfinite(log_prob_sum) or log_prob_max > 0:
            check_log_probs(fields["old_log_probs"], response_mask)  # raises with counts and positions
            self.scorer.validate(fields)
        step_metrics = metrics.token_prob_metrics(token_values)
        count = token_values[2]
        if step_output.weights is not None:
            *quantiles, sampled = values["quantiles"]
            if count and not sampled:  # the strided sample missed every valid token (rare): read them all
                quantiles = metrics.sample_quantiles(step_output.weights, response_mask)
            step_metrics.update(metrics.weight_metrics(values["weights"], count, quantiles))
        step_metrics[keys.ACTIVE] = float(step_output.weights is not None)
        if step_output.stage_masks is not None:
            step_metrics.update(self.stage_metrics(values.get("stages", []), count))
        hists = metrics.histograms_from({name: values[name] for name in step_output.histogram_names})
        return MechanismOutput(step_output.advantages, step_output.weights, step_metrics, hists,
                               step_output.stage_masks)

    def device_step(self, step: int, fields: Fields, *, histograms: bool = False) -> DeviceStep:
        """Everything :meth:`process` computes, on the batch's device and without a host synchronisation: the
        statistics stay tensors, named, for one read (:func:`metrics.read_on_host`). ``fields`` must have passed
        :meth:`_check_fields`."""
        response_mask = fields["response_mask"].bool()
        statistics: dict[str, torch.Tensor] = {}
        active = self.is_active(step)
        if active:
            # The compiled kernels read a numeric mask much faster than a bool one (bool loads are not vectorised
            # on the CPU); verl's response_mask is numeric already, a bool one is converted once.
            core_mask = fields["response_mask"] if self._compiled else response_mask
            if self._compiled and core_mask.dtype == torch.bool:
                core_mask = core_mask.to(torch.float32)
            advantages, weights, token_probs, statistics["tokens"], statistics["weights"] = self._active_core(
                fields, core_mask)
            statistics["quantiles"] = metrics.sample_quantile_tensor(weights, response_mask)
        else:
            advantages, weights = fields["advantages"], None
            token_probs, statistics["tokens"] = self._token_probs(fields, response_mask)
        # The value checks ride on the statistics' single host synchronisation.
        statistics["faults"] = input_faults(fields["advantages"], fields["response_mask"], response_mask)
        statistics["field_faults"] = torch.stack(
            [(~torch.isfinite(fields[name]) & response_mask).sum().double() for name in self._checked_fields]
        ) if self._checked_fields else torch.zeros(0, dtype=torch.float64, device=response_mask.device)
        stage_masks = self.stage_masks(fields, token_probs) if active else None  # before warmup: one update
        if stage_masks is not None:
            statistics["stages"] = self.stage_statistics(stage_masks)
        histogram_names: tuple[str, ...] = ()
        if histograms:
            reads_entropy = "entropy" in self.required_fields
            entropy = masked_entropy(fields["entropy"], response_mask) if reads_entropy else None
            counts = metrics.mechanism_histogram_counts(weights, token_probs, response_mask, entropy)
            statistics.update(counts)
            histogram_names = tuple(counts)
        return DeviceStep(advantages, weights, token_probs, stage_masks, statistics, histogram_names)

    def _token_probs(self, fields: Fields, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pi, token statistics)``: ``pi = exp(old_log_probs)`` on valid tokens, 1.0 elsewhere."""
        log_probs = masked_log_probs(fields["old_log_probs"], response_mask)
        token_probs = log_probs.exp()
        return token_probs, metrics.token_stats(log_probs, token_probs, response_mask)

    def _reweight(self, fields: Fields, mask: torch.Tensor):
        """The hot path, pure tensor code (fusable): ``(advantages, weights, pi, token stats, weight stats)``.

        ``mask``: the response mask, boolean or numeric (valid where > 0).
        """
        response_mask = mask if mask.dtype == torch.bool else mask > 0
        token_probs, token_vector = self._token_probs(fields, response_mask)
        signal = self.scorer.score_given_probs(fields, token_probs)
        advantages = fields["advantages"]
        inputs = {}
        if self.actuator.needs_advantages:
            inputs["advantages"] = advantages
        if self.actuator.needs_token_probs:
            inputs["token_probs"] = token_probs
        weights = self.actuator.weights(signal, response_mask, **inputs)
        # Masked positions pass through untouched: with weights exactly 1.0 on valid tokens (alpha = 0) the
        # output is the input bit for bit.
        reweighted = torch.where(response_mask, advantages.float() * weights, advantages.float()).to(advantages.dtype)
        return reweighted, weights, token_probs, token_vector, metrics.weight_stats(weights, response_mask)

    def stage_masks(self, fields: Fields, token_probs: torch.Tensor | None) -> list[torch.Tensor] | None:
        """Update stages (``None``: one update over all tokens). Overridden by staged mechanisms.

        ``token_probs`` is ``exp(old_log_probs)`` on valid tokens and 1.0 at masked positions.
        """
        return None

    def stage_statistics(self, stage_masks: list[torch.Tensor]) -> torch.Tensor:
        """The stages' statistics as a 1-D tensor on the batch's device, read with the step's other statistics
        (none here; see :meth:`stage_metrics`)."""
        return stage_masks[0].new_zeros(0, dtype=torch.float64)

    def stage_metrics(self, values: list[float], valid_tokens: float) -> dict[str, float]:
        """Metrics from :meth:`stage_statistics`' values read on the host (none here)."""
        return {}

    def apply(self, step: int, fields: Fields) -> tuple[torch.Tensor, dict[str, float]]:
        """``(advantages * weights, metrics)``; before ``warmup_step`` the advantages come back unchanged."""
        output = self.process(step, fields)
        return output.advantages, output.metrics

    def compute_weights(self, step: int, fields: Fields) -> tuple[torch.Tensor, dict[str, float]]:
        """``(weights, metrics)``; weights are 1.0 on valid tokens before ``warmup_step``, 0 at masked ones."""
        output = self.process(step, fields)
        weights = output.weights
        if weights is None:
            weights = fields["response_mask"].bool().to(torch.float32)
        return weights, output.metrics

    def histograms(self, step: int, fields: Fields) -> dict[str, metrics.Histogram]:
        """The weight and token-probability histograms of one step (see :meth:`process`)."""
        return self.process(step, fields, histograms=True).histograms

    def _check_fields(self, fields: Fields) -> None:
        """Refuse fields the mechanism would get wrong, from their metadata only (no pass over the data):
        missing fields, non-tensors, fields that are not 2-D or not of ``response_mask``'s shape, non-floating
        advantages or log-probs (integer advantages would be truncated by the reweighting), fields on the meta
        device or on different devices. The values are checked by :func:`input_faults`."""
        needed = self.required_fields
        missing = sorted(needed - set(fields))
        if missing:
            raise KeyError(f"mechanism {self.name!r} needs batch field(s) {missing}; got {sorted(fields)}")
        for name in sorted(needed):
            value = fields[name]
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"batch field {name!r} is a {type(value).__name__}; it must be a torch.Tensor")
            if value.dim() != 2:
                raise ValueError(
                    f"batch field {name!r} has {value.dim()} dimension(s) (shape {tuple(value.shape)}); every field "
                    f"is 2-D: (batch size, response length)"
                )
            if value.device.type == "meta":
                raise ValueError(f"batch field {name!r} is on the meta device (it holds no data); move it to the "
                                 f"device of the batch")
        shape = fields["response_mask"].shape
        device = fields["response_mask"].device
        for name in sorted(needed):
            if fields[name].shape != shape:
                raise ValueError(
                    f"batch field {name!r} has shape {tuple(fields[name].shape)}, expected {tuple(shape)} "
                    f"(the shape of response_mask)"
                )
            if fields[name].device != device:
                raise ValueError(
                    f"batch field {name!r} is on {fields[name].device}, response_mask on {device}: every field "
                    f"must be on one device"
                )
        for name in ("advantages", "old_log_probs"):
            if not fields[name].is_floating_point():
                raise TypeError(
                    f"batch field {name!r} has dtype {fields[name].dtype}; it must be floating point "
                    f"(float32, bfloat16, ...): integer values would be truncated when reweighted"
                )


def input_faults(advantages: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[mask values other than 0 and 1, non-finite advantages on valid tokens]`` as a float64 ``(2,)`` tensor.

    ``mask``: the response mask as given (bool or numeric); ``response_mask``: it as bool. No host sync: the counts
    are read with the statistics.
    """
    if mask.dtype == torch.bool or mask.numel() == 0:
        bad_mask = torch.zeros((), dtype=torch.int64, device=mask.device)
    else:
        bad_mask = ((mask != 0) & (mask != 1)).sum()  # NaN compares unequal to both: counted
    bad_advantages = (~torch.isfinite(advantages) & response_mask).sum()
    return torch.stack([bad_mask, bad_advantages]).double()


def raise_input_faults(fields: Fields, response_mask: torch.Tensor, bad_mask: int, bad_advantages: int) -> None:
    """Raise ``ValueError`` naming the field, how many values are wrong and the first ones (row, position)."""
    if bad_mask:
        mask = fields["response_mask"]
        positions = ((mask != 0) & (mask != 1)).nonzero()[:5].tolist()
        values = {tuple(p): float(mask[p[0], p[1]]) for p in positions}
        raise ValueError(
            f"batch field 'response_mask' has {bad_mask} value(s) other than 0 and 1; first (row, position) -> "
            f"value: {values}. A response mask is 1 on valid tokens and 0 elsewhere"
        )
    advantages = fields["advantages"]
    positions = (~torch.isfinite(advantages) & response_mask).nonzero()[:5].tolist()
    values = {tuple(p): float(advantages[p[0], p[1]]) for p in positions}
    raise ValueError(
        f"batch field 'advantages' has {bad_advantages} NaN or infinite value(s) on valid tokens; first "
        f"(row, position) -> value: {values}. Advantages must be finite where response_mask is 1"
    )


@register_mechanism("reweight")
class ReweightMechanism(Mechanism):
    """Token-level reweighting of advantages: ``A_t <- A_t * w_t`` on valid tokens."""

    name = "reweight"


@register_mechanism("isolate")
class IsolateMechanism(Mechanism):
    """Low-Probability Token Isolation (Lopti, arXiv:2505.12929), with the ``lopti`` actuator's reweighting inside.

    Valid tokens are split into a low group, ``pi < t`` (``pi = exp(old_log_probs)``), and the rest, where the
    threshold ``t`` is ``|eta|`` (``split: threshold``) or the ``|eta|``-quantile of the batch's valid ``pi``
    (``split: quantile``, linear interpolation as ``torch.quantile``; tokens with ``pi = 0`` are left out of the
    quantile, as in the paper's code). The policy is updated twice per step, the low group first for ``eta > 0`` and
    the rest first for ``eta < 0``; each stage sees the (reweighted) advantages of its own group only, 0 elsewhere,
    and its KL and entropy terms over its own tokens only (the paper code's ``kl_entropy_mask``). The trainer keeps
    ``old_log_probs`` fixed across the stages and normalises each stage's loss over all response tokens, as the
    paper's code does. Both stages always run, even when one group is empty (as in the paper's code).
    """

    name = "isolate"
    default_actuator = "lopti"
    actuators_allowed = ("lopti",)
    staged = True
    # The threshold of the latest split, for the step's metrics (set by stage_masks, read right after by process):
    # a Python float for ``split: threshold``, a 0-d tensor on the batch's device for ``split: quantile``.
    _last_threshold: float | torch.Tensor = float("nan")

    def split_threshold(self, token_probs: torch.Tensor, response_mask: torch.Tensor) -> float:
        """The probability threshold ``t`` of the low group ``pi < t`` (see the class docstring)."""
        return float(self.split_threshold_tensor(token_probs, response_mask))

    def split_threshold_tensor(self, token_probs: torch.Tensor, response_mask: torch.Tensor) -> float | torch.Tensor:
        """:meth:`split_threshold` without a host sync: ``|eta|`` or a 0-d tensor on the batch's device."""
        params = self.actuator.params
        if params.split == "threshold":
            return abs(params.eta)
        return masked_quantile_tensor(token_probs, response_mask & (token_probs > 0), abs(params.eta))

    def stage_masks(self, fields: Fields, token_probs: torch.Tensor | None) -> list[torch.Tensor]:
        """``[first, second]`` boolean ``(bs, L)`` masks; together they cover the valid tokens exactly once."""
        response_mask = fields["response_mask"].bool()
        if token_probs is None:
            token_probs = masked_log_probs(fields["old_log_probs"], response_mask).exp()
        threshold = self.split_threshold_tensor(token_probs, response_mask)
        self._last_threshold = threshold
        low = response_mask & (token_probs < threshold)
        high = response_mask & ~low
        return [low, high] if self.actuator.params.eta > 0 else [high, low]

    def stage_statistics(self, stage_masks: list[torch.Tensor]) -> torch.Tensor:
        """``[tokens in the low group]`` and, for the quantile split, ``t``."""
        low = stage_masks[0 if self.actuator.params.eta > 0 else 1]
        parts = [low.sum().double().reshape(1)]
        if isinstance(self._last_threshold, torch.Tensor):
            parts.append(self._last_threshold.double().reshape(1))
        return torch.cat(parts)

    def stage_metrics(self, values: list[float], valid_tokens: float) -> dict[str, float]:
        """``dataflex/lopti/low_token_frac`` (share of valid tokens in the low group) and ``dataflex/lopti/threshold``
        (the split's ``t``), while staging is active."""
        low_count, *threshold = values
        return {keys.LOPTI_LOW_TOKEN_FRAC: low_count / valid_tokens if valid_tokens else 0.0,
                keys.LOPTI_THRESHOLD: threshold[0] if threshold else float(self._last_threshold)}


def staged_mechanism_names() -> list[str]:
    """Registered mechanisms that split the policy update in stages (:attr:`Mechanism.staged`)."""
    return [name for name in MECHANISMS.names() if MECHANISMS.get(name).staged]

