"""The mechanism a trainer calls once per step, after advantages and before the policy update: a scorer (fields ->
signal) and an actuator (signal -> weights) applied to the advantages. Every field is ``(bs, L)``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

import dataflex_rl.keys as keys
import dataflex_rl.metrics as metrics
from dataflex_rl.actuators import ACTUATORS, Actuator
from dataflex_rl.scorers import SCORERS, Scorer, bad_positions, check_log_probs, masked_entropy, masked_log_probs
from dataflex_rl.validation import ConfigError

Fields = Mapping[str, torch.Tensor]

# ``dataflex.mechanism`` -> its default actuator; ``isolate`` takes the staged actuators (one update per stage).
MECHANISMS = {"isolate": "lopti", "reweight": "advantage_reweight"}
STAGED_MECHANISM = "isolate"
DEFAULT_MECHANISM = "reweight"
DEFAULT_SCORER = "token_prob"
# Batch fields every backend hands to a mechanism (verl's names); ``entropy`` is the old policy's, per token.
PROVIDED_FIELDS = frozenset({"old_log_probs", "response_mask", "advantages", "entropy"})


def check_combination(mechanism: str, scorer_cls: type[Scorer], actuator_cls: type[Actuator]) -> None:
    """Refuse a scorer, actuator and mechanism that do not fit: the signal, the batch fields, the staging."""
    if scorer_cls.signal not in actuator_cls.signals:
        raise ConfigError(
            f"dataflex.scorer.name = {scorer_cls.name!r} produces a {scorer_cls.signal!r} signal, but "
            f"dataflex.actuator.name = {actuator_cls.name!r} consumes only {sorted(actuator_cls.signals)}"
        )
    missing = [field for field in scorer_cls.required_fields if field not in PROVIDED_FIELDS]
    if missing:
        raise ConfigError(f"dataflex.scorer.name = {scorer_cls.name!r} requires batch field(s) {missing} that "
                          f"dataflex.mechanism = {mechanism!r} does not provide; it provides {sorted(PROVIDED_FIELDS)}")
    staged = mechanism == STAGED_MECHANISM
    if actuator_cls.staged and not staged:
        raise ConfigError(
            f"dataflex.actuator.name = {actuator_cls.name!r} cannot drive dataflex.mechanism = {mechanism!r}: it "
            f"splits the policy update in stages, which this mechanism does not; use mechanism {STAGED_MECHANISM!r}"
        )
    if staged and not actuator_cls.staged:
        allowed = [name for name in ACTUATORS.names() if ACTUATORS.get(name).staged]
        raise ConfigError(f"dataflex.actuator.name = {actuator_cls.name!r} cannot drive dataflex.mechanism = "
                          f"{mechanism!r}; allowed actuators: {allowed}")


@dataclasses.dataclass
class MechanismOutput:
    """A step's result: the reweighted advantages, the weights (None before ``warmup_step``), ``token_probs`` (``pi``
    on valid tokens, 1.0 elsewhere: ``exp(old_log_probs)`` once a step, for the trainer's statistics too), the
    metrics and histograms read on the host, and a staged actuator's update masks."""

    advantages: torch.Tensor
    weights: torch.Tensor | None
    metrics: dict[str, float]
    histograms: dict[str, metrics.Histogram] = dataclasses.field(default_factory=dict)
    stage_masks: list[torch.Tensor] | None = None
    token_probs: torch.Tensor | None = None


@dataclasses.dataclass
class DeviceStep:
    """One step on the batch's device, before its one host read: its tensors and the statistics to read."""

    advantages: torch.Tensor
    weights: torch.Tensor | None
    token_probs: torch.Tensor
    stage_masks: list[torch.Tensor] | None
    statistics: dict[str, torch.Tensor]
    histogram_names: tuple[str, ...] = ()


class Mechanism:
    """Scorer + actuator, active from ``warmup_step`` on."""

    def __init__(self, config: Any, *, compile: bool = False) -> None:
        """``config``: a validated :class:`dataflex_rl.dataflex_block.DataflexConfig`."""
        self.config = config
        scorer_cls = SCORERS.get(config.scorer.name)
        actuator_cls = ACTUATORS.get(config.actuator.name)
        self.scorer: Scorer = scorer_cls(config.scorer.make_params(scorer_cls.Params))
        self.actuator: Actuator = actuator_cls(config.actuator.make_params(actuator_cls.Params))
        self.warmup_step = config.warmup_step
        # The scorer's own float fields beside old_log_probs (e.g. entropy): checked for NaN/inf on valid tokens.
        self._checked_fields = tuple(sorted(set(self.scorer.required_fields) - {"old_log_probs", "response_mask"}))
        # torch.compile fuses the step into a few kernels; the first call compiles (seconds): for large batches.
        self._compiled = compile
        self._active_core = torch.compile(reweight, dynamic=True) if compile else reweight

    @property
    def staged(self) -> bool:
        """Whether the policy update is split in the actuator's stages (:attr:`MechanismOutput.stage_masks`)."""
        return self.actuator.staged

    @property
    def required_fields(self) -> frozenset[str]:
        return frozenset({"response_mask", "advantages", "old_log_probs", *self.scorer.required_fields})

    def is_active(self, step: int) -> bool:
        """Active from ``warmup_step`` on (``step`` as the trainer counts it; verl's global steps start at 1)."""
        return step >= self.warmup_step

    def process(self, step: int, fields: Fields, *, histograms: bool = False) -> MechanismOutput:
        """The step: :meth:`device_step`, its statistics read on the host at once, the input checks that read,
        then the metrics."""
        self._check_fields(fields)
        step_output = self.device_step(step, fields, histograms=histograms)
        values = metrics.read_on_host(step_output.statistics)  # the step's one host synchronisation
        response_mask = fields["response_mask"].bool()
        bad_mask_values, bad_advantages = values["faults"]
        if bad_mask_values or bad_advantages:
            raise_input_faults(fields, response_mask, int(bad_mask_values), int(bad_advantages))
        if any(values["field_faults"]):
            self.scorer.validate(fields)  # raises naming the field, counts and positions
        tokens = metrics.TokenStats(*values["tokens"])
        if not math.isfinite(tokens.log_prob_sum) or tokens.log_prob_max > 0:
            check_log_probs(fields["old_log_probs"], response_mask)  # raises with counts and positions
            self.scorer.validate(fields)
        step_metrics = metrics.token_prob_metrics(tokens)
        if step_output.weights is not None:
            *quantiles, sampled = values["quantiles"]
            if tokens.count and not sampled:  # the strided sample missed every valid token (rare): read them all
                quantiles = metrics.sample_quantiles(step_output.weights, response_mask)
            step_metrics.update(metrics.weight_metrics(metrics.WeightStats(*values["weights"]), tokens.count,
                                                       quantiles))
        step_metrics[keys.ACTIVE] = float(step_output.weights is not None)
        if step_output.stage_masks is not None:
            step_metrics.update(self.actuator.stage_metrics(values["stages"], tokens.count))
        hists = metrics.histograms_from({name: values[name] for name in step_output.histogram_names})
        return MechanismOutput(step_output.advantages, step_output.weights, step_metrics, hists,
                               step_output.stage_masks, step_output.token_probs)

    def device_step(self, step: int, fields: Fields, *, histograms: bool = False) -> DeviceStep:
        """Everything :meth:`process` computes, on the batch's device without a host sync."""
        response_mask = fields["response_mask"].bool()
        statistics: dict[str, torch.Tensor] = {}
        if self.is_active(step):
            # Compiled kernels read a numeric mask much faster than a bool one (bool loads are not vectorised).
            core_mask = fields["response_mask"] if self._compiled else response_mask
            if self._compiled and core_mask.dtype == torch.bool:
                core_mask = core_mask.to(torch.float32)
            advantages, weights, token_probs, statistics["tokens"], statistics["weights"] = self._active_core(
                self.scorer, self.actuator, fields, core_mask)
            statistics["quantiles"] = metrics.sample_quantile_tensor(weights, response_mask)
        else:
            advantages, weights = fields["advantages"], None
            token_probs, statistics["tokens"] = probabilities(fields["old_log_probs"], response_mask)
        # The value checks ride on the statistics' single host synchronisation.
        statistics["faults"] = input_faults(fields["advantages"], fields["response_mask"], response_mask)
        statistics["field_faults"] = torch.stack(
            [(~torch.isfinite(fields[name]) & response_mask).sum().double() for name in self._checked_fields]
        ) if self._checked_fields else torch.zeros(0, dtype=torch.float64, device=response_mask.device)
        stage_masks = None  # before warmup: one update
        if weights is not None and self.staged:
            stage_masks, statistics["stages"] = self.actuator.stages(token_probs, response_mask)
        histogram_names: tuple[str, ...] = ()
        if histograms:
            entropy = masked_entropy(fields["entropy"], response_mask) if "entropy" in self.required_fields else None
            counts = metrics.mechanism_histogram_counts(weights, token_probs, response_mask, entropy)
            statistics.update(counts)
            histogram_names = tuple(counts)
        return DeviceStep(advantages, weights, token_probs, stage_masks, statistics, histogram_names)

    def apply(self, step: int, fields: Fields) -> tuple[torch.Tensor, dict[str, float]]:
        """``(advantages * weights, metrics)``; before ``warmup_step`` the advantages come back unchanged."""
        output = self.process(step, fields)
        return output.advantages, output.metrics

    def compute_weights(self, step: int, fields: Fields) -> tuple[torch.Tensor, dict[str, float]]:
        """``(weights, metrics)``; weights are 1.0 on valid tokens before ``warmup_step``, 0 at masked ones."""
        output = self.process(step, fields)
        weights = output.weights if output.weights is not None else fields["response_mask"].bool().to(torch.float32)
        return weights, output.metrics

    def histograms(self, step: int, fields: Fields) -> dict[str, metrics.Histogram]:
        return self.process(step, fields, histograms=True).histograms

    def _check_fields(self, fields: Fields) -> None:
        needed = self.required_fields
        missing = sorted(needed - set(fields))
        if missing:
            raise KeyError(f"mechanism {self.config.mechanism!r} needs batch field(s) {missing}; got {sorted(fields)}")
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
        shape, device = fields["response_mask"].shape, fields["response_mask"].device
        for name in sorted(needed):
            if fields[name].shape != shape:
                raise ValueError(f"batch field {name!r} has shape {tuple(fields[name].shape)}, expected {tuple(shape)} "
                                 f"(the shape of response_mask)")
            if fields[name].device != device:
                raise ValueError(
                    f"batch field {name!r} is on {fields[name].device}, response_mask on {device}: every field "
                    f"must be on one device"
                )
        for name in ("advantages", "old_log_probs"):
            if not fields[name].is_floating_point():
                raise TypeError(f"batch field {name!r} has dtype {fields[name].dtype}; it must be floating point "
                                f"(float32, bfloat16, ...): integer values would be truncated when reweighted")


def probabilities(old_log_probs: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pi, its TokenStats tensor)``: ``pi = exp(old_log_probs)`` ``(bs, L)`` float32 on valid tokens, 1.0 at
    masked positions (``response_mask`` bool ``(bs, L)``), computed once a step."""
    log_probs = masked_log_probs(old_log_probs, response_mask)
    token_probs = log_probs.exp()
    return token_probs, metrics.token_stats(log_probs, token_probs, response_mask)


def reweight(scorer: Scorer, actuator: Actuator, fields: Fields, mask: torch.Tensor):
    """The active step as one pure function (the one ``torch.compile`` may fuse): ``(advantages * weights, weights,
    pi, TokenStats tensor, WeightStats tensor)``, each ``(bs, L)`` but the stats; masked positions pass through, so
    alpha = 0 gives the advantages bit for bit."""
    response_mask = mask if mask.dtype == torch.bool else mask > 0
    token_probs, token_vector = probabilities(fields["old_log_probs"], response_mask)
    advantages = fields["advantages"]
    weights = actuator.weights(scorer.score(fields, token_probs), response_mask, advantages, token_probs)
    reweighted = torch.where(response_mask, advantages.float() * weights, advantages.float()).to(advantages.dtype)
    return reweighted, weights, token_probs, token_vector, metrics.weight_stats(weights, response_mask)


def input_faults(advantages: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[mask values other than 0 and 1, non-finite advantages on valid tokens]`` as a float64 ``(2,)`` tensor."""
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
        _, values = bad_positions(mask, (mask != 0) & (mask != 1))
        raise ValueError(
            f"batch field 'response_mask' has {bad_mask} value(s) other than 0 and 1; first (row, position) -> "
            f"value: {values}. A response mask is 1 on valid tokens and 0 elsewhere"
        )
    advantages = fields["advantages"]
    _, values = bad_positions(advantages, ~torch.isfinite(advantages) & response_mask)
    raise ValueError(f"batch field 'advantages' has {bad_advantages} NaN or infinite value(s) on valid tokens; first "
                     f"(row, position) -> value: {values}. Advantages must be finite where response_mask is 1")
