"""The policy-loss route: the run's token rule inside verl's policy loss, so any verl trainer runs it (docs/verl.md).
``DataflexPolicyLossConfig`` (route_config.py) carries the ``dataflex`` block to the actor workers; the loss sees one
micro-batch of one data-parallel rank, whose valid tokens the weights are normalised over. Imports neither
TransferQueue nor verl's V1 trainers."""

import functools
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn, register_policy_loss

from dataflex_rl.dataflex_block import build_mechanism
from dataflex_rl.mechanism import Mechanism, MechanismOutput
from dataflex_rl.metrics import HISTOGRAM_EDGES, Histogram, prob_bucket_stats
from dataflex_rl.validation import ConfigError, to_plain
from dataflex_rl.verl.config import (EXAMPLE_OVERRIDES, LOSS_MODE, LOSS_MODE_KEY, POLICY_LOSS_KEY, ROUTE_OVERRIDES,
                                     TRAINER_MODE_HINT)

# What verl's policy loss is given per token, in the mechanism's names (verl's loss calls them old_log_prob, ...).
LOSS_FIELDS = frozenset({"old_log_probs", "response_mask", "advantages"})


def check_route(config: Any) -> None:
    """The route's config as verl builds it (another loss mode: nothing to check): the rule refused if verl's loss
    cannot run it, and the losses checked as registered."""
    if config.loss_mode != LOSS_MODE:
        return
    block, base_loss_mode = config.dataflex, config.base_loss_mode
    if get_policy_loss_fn(LOSS_MODE) is not dataflex_policy_loss:
        raise ConfigError(f"{LOSS_MODE_KEY} = {LOSS_MODE!r}: verl's registry holds another loss under that name "
                          f"({get_policy_loss_fn(LOSS_MODE).__module__}); remove the plugin that registers it")
    if block is None:
        raise ConfigError(f"{POLICY_LOSS_KEY}.dataflex: missing; {LOSS_MODE_KEY}={LOSS_MODE} reads the rule from "
                          f"the run's dataflex block: add {ROUTE_OVERRIDES[2]} and the block, e.g. {EXAMPLE_OVERRIDES}")
    mechanism = build_mechanism(to_plain(block))
    route = f"{LOSS_MODE_KEY}={LOSS_MODE}"
    if mechanism.staged:
        raise ConfigError(f"dataflex.mechanism = {mechanism.config.mechanism!r} is not allowed with {route}: its "
                          f"rule updates the policy once per stage, which a loss cannot do; run it in a dataflex "
                          f"trainer mode, {TRAINER_MODE_HINT}")
    missing = sorted(mechanism.required_fields - LOSS_FIELDS)
    if missing:
        raise ConfigError(f"dataflex.scorer.name = {mechanism.config.scorer.name!r} is not allowed with {route}: it "
                          f"reads {missing}, which verl does not give a policy loss (it gets old_log_prob, log_prob, "
                          f"advantages, response_mask); run it in a dataflex trainer mode, {TRAINER_MODE_HINT}")
    if mechanism.warmup_step:
        raise ConfigError(f"dataflex.warmup_step = {mechanism.warmup_step!r} is not allowed with {route}: verl does "
                          f"not give a policy loss the step; use 0, or a dataflex trainer mode, {TRAINER_MODE_HINT}")
    if base_loss_mode == LOSS_MODE or base_loss_mode not in POLICY_LOSS_REGISTRY:
        allowed = sorted(set(POLICY_LOSS_REGISTRY) - {LOSS_MODE})
        raise ConfigError(f"{POLICY_LOSS_KEY}.base_loss_mode = {base_loss_mode!r} is not allowed: the loss under the "
                          f"rule is one of verl's registered policy losses {allowed}")


@functools.lru_cache(maxsize=8)
def route_mechanism(block_json: str) -> Mechanism:
    """The mechanism of a ``dataflex`` block (as sorted JSON), built once per process."""
    return build_mechanism(json.loads(block_json))


def mechanism_step(mechanism: Mechanism, step: int, fields: Mapping[str, torch.Tensor], *,
                   histograms: bool) -> tuple[MechanismOutput, dict[str, float]]:
    """:meth:`Mechanism.process` and its metrics with the gradient statistics by token probability."""
    output = mechanism.process(step, fields, histograms=histograms)  # pi = exp(old_log_probs) once, in there
    buckets = prob_bucket_stats(output.token_probs, output.advantages, fields["response_mask"].bool())
    return output, {**output.metrics, **buckets}


def histogram_bins(histograms: Mapping[str, Histogram], infix: str = "") -> dict[str, float]:
    """Each bin's count as a metric ``<name>/<infix><bin>``: verl's metric path takes scalars only."""
    return {f"{name}/{infix}{index:03d}": float(count) for name, histogram in histograms.items()
            for index, count in enumerate(histogram.counts)}


def pop_histograms(metrics: dict[str, Any], infix: str = "") -> dict[str, Histogram]:
    """:func:`histogram_bins` undone: the histograms, their bins taken out of ``metrics``. In the route verl
    averages a metric over a step's micro-batches, so a bin holds the mean micro-batch's count, rounded here."""
    histograms = {}
    for name, edges in HISTOGRAM_EDGES.items():
        names = [f"{name}/{infix}{index:03d}" for index in range(len(edges) - 1)]
        if all(bin_name in metrics for bin_name in names):
            counts = np.rint([metrics.pop(bin_name) for bin_name in names]).astype(np.int64)
            histograms[name] = Histogram(np.asarray(edges, dtype=np.float64), counts)
    return histograms


@register_policy_loss(LOSS_MODE)
def dataflex_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                         response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config: Any = None,
                         rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``base_loss_mode`` loss on the micro-batch's advantages times the rule's weights. Every tensor is
    ``(bs, L)``; ``old_log_prob`` is what verl's loss reads as the old policy's (the actor's recomputed log-probs)."""
    route = getattr(config, "policy_loss", None)
    if getattr(route, "dataflex", None) is None:  # verl's own PolicyLossConfig: no _target_ override
        raise ConfigError(f"{LOSS_MODE_KEY}={LOSS_MODE} needs the route's config class: add "
                          f"{ROUTE_OVERRIDES[1]} {ROUTE_OVERRIDES[2]}")
    mechanism = route_mechanism(json.dumps(route.dataflex, sort_keys=True))
    fields = {"old_log_probs": old_log_prob, "response_mask": response_mask, "advantages": advantages}
    output, metrics = mechanism_step(mechanism, mechanism.warmup_step, fields, histograms=route.histograms)
    loss, base_metrics = get_policy_loss_fn(route.base_loss_mode)(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=output.advantages, response_mask=response_mask,
        loss_agg_mode=loss_agg_mode, config=config, rollout_is_weights=rollout_is_weights)
    return loss, {**base_metrics, **metrics, **histogram_bins(output.histograms)}
