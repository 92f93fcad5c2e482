"""``dataflex_sync``: verl 0.9.1's V1 synchronous PPO trainer with the dataflex mechanism after the advantages.

verl has no hook between computing advantages and updating the actor, so this subclass overrides
``_compute_advantage``: verl computes the advantages (and, with rollout correction, ``rollout_is_weights``) as
usual, then :meth:`DataflexSyncTrainer._apply_mechanism` reads ``old_log_probs``, ``response_mask`` and
``advantages`` for the whole batch from TransferQueue, calls ``Mechanism.process`` once (so the weights are
mean-normalised over the batch, not per micro-batch) and writes only ``advantages`` back. ``rollout_is_weights``
is never read or written: verl's policy loss multiplies it in, so the two compose.

A staged mechanism (Lopti, ``dataflex.mechanism=isolate``) hands over its stage masks; ``_update_actor`` then runs
verl's actor update once per stage, each time with ``advantages`` = the reweighted advantages on the stage's tokens
and 0 elsewhere, and ``old_log_probs`` untouched between the stages; verl's token-mean loss normalises each stage
over all response tokens, as the paper's code does. Afterwards the full reweighted advantages are written back, so
verl's step metrics see them. The actor metrics are the mean over the stages (as in the paper's code), plus
``actor/update_stages``.

Shapes: TransferQueue holds each response field as a jagged nested tensor ``(bs, j)``; the mechanism sees the
padded ``(bs, L)`` tensors (``L`` = longest response in the batch, padding 0, ``response_mask`` 0 there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer
from verl.workers.utils.padding import response_to_nested

from dataflex_rl import keys
from dataflex_rl.config import ConfigError, to_plain
from dataflex_rl.mechanism import Mechanism, build_mechanism
from dataflex_rl.metrics import prob_bucket_stats
from dataflex_rl.verl.histograms import WandbHistogramLogger

TRAINER_NAME = "dataflex_sync"
# The fields the mechanism reads (verl's TransferQueue names); only "advantages" is written back.
MECHANISM_FIELDS = ("old_log_probs", "response_mask", "advantages")
# marked_timer("mechanism") becomes verl's timing metric "timing_s/mechanism".
MECHANISM_TIMER = keys.TIMING_MECHANISM.removeprefix("timing_s/")
EXAMPLE_OVERRIDES = (
    "+dataflex.mechanism=reweight +dataflex.scorer.name=token_prob "
    "+dataflex.actuator.name=advantage_reweight +dataflex.actuator.params.alpha=0.5"
)


def mechanism_from_verl_config(config: DictConfig | Mapping[str, Any]) -> Mechanism:
    """Validate the ``dataflex`` block of a verl config and build its mechanism (no worker is started).

    Raises :class:`ConfigError` with the same message as the local backend for a bad value, and also when the
    block is missing.
    """
    block = config.get("dataflex") if isinstance(config, (DictConfig, Mapping)) else None
    if block is None:
        raise ConfigError(
            f"dataflex: missing; trainer.v1.trainer_mode={TRAINER_NAME} needs a dataflex block on the verl "
            f"command line, e.g. {EXAMPLE_OVERRIDES}"
        )
    mechanism = build_mechanism(to_plain(block))
    if type(mechanism).stage_masks is not Mechanism.stage_masks:
        check_constant_schedule(config, mechanism)
    return mechanism


def check_constant_schedule(config: DictConfig | Mapping[str, Any], mechanism: Mechanism) -> None:
    """Refuse a staged mechanism with a learning-rate schedule that moves.

    Each stage is one verl actor update, and each update steps verl's LR scheduler, which verl sizes for one update
    per training step: warmup and decay would run that many times too fast.
    """
    optim = to_plain(config).get("actor_rollout_ref", {}).get("actor", {}).get("optim", {}) or {}
    moving = {
        "actor_rollout_ref.actor.optim.lr_scheduler_type": optim.get("lr_scheduler_type", "constant") != "constant",
        "actor_rollout_ref.actor.optim.lr_warmup_steps": (optim.get("lr_warmup_steps") or 0) > 0,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": (optim.get("lr_warmup_steps_ratio") or 0) > 0,
    }
    for key, is_moving in moving.items():
        if is_moving:
            raise ConfigError(
                f"{key} = {optim.get(key.rsplit('.', 1)[-1])!r} is not allowed with dataflex.mechanism = "
                f"{mechanism.config.mechanism!r}: each of its update stages steps verl's LR scheduler, which verl "
                f"sizes for one update per step; use a constant schedule without warmup (lr_scheduler_type=constant, "
                f"lr_warmup_steps=0, lr_warmup_steps_ratio=0)"
            )


@dataclasses.dataclass
class PendingStages:
    """A batch's staged update, from the advantage step to the actor update.

    ``advantages``: the reweighted advantages ``(bs, L)`` (padded); ``stage_masks``: boolean ``(bs, L)`` masks, in
    order; ``nested_response_mask``: TransferQueue's jagged ``(bs, j)`` mask, to write advantages back.
    """

    keys: tuple[str, ...]
    advantages: torch.Tensor
    stage_masks: list[torch.Tensor]
    nested_response_mask: torch.Tensor


def merge_stage_metrics(per_stage: list[dict[str, Any]]) -> dict[str, float]:
    """The mean over the stages of each actor metric (a metric missing from a stage is averaged over the others)."""
    names = dict.fromkeys(name for stage in per_stage for name in stage)
    return {name: float(np.mean([stage[name] for stage in per_stage if name in stage])) for name in names}


def wandb_enabled(config: DictConfig | Mapping[str, Any]) -> bool:
    """Whether ``trainer.logger`` (a name or a list of names) includes ``wandb``."""
    loggers = config["trainer"].get("logger") or []
    return "wandb" in ([loggers] if isinstance(loggers, str) else list(loggers))


@register_trainer(TRAINER_NAME)
class DataflexSyncTrainer(PPOTrainerSync):
    """verl's sync trainer plus ``Mechanism.process`` on each batch's advantages (see the module docstring)."""

    def __init__(self, config: DictConfig) -> None:
        # Validate before verl builds anything, so a bad dataflex block stops the run before any worker starts.
        self.mechanism = mechanism_from_verl_config(config)
        self.histogram_logger = WandbHistogramLogger(self.mechanism.config.mechanism) if wandb_enabled(config) else None
        super().__init__(config)

    # verl's base class reads ``self.trainer_mode == "sync"`` to pick the sync replay buffer, prompt refill and
    # checkpoint behaviour, and ``trainer.v1.<trainer_mode>`` for its settings. This trainer *is* the sync trainer,
    # so it answers "sync"; the registered name stays in ``trainer.v1.trainer_mode``.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, registered_name: str) -> None:
        self.registered_name = registered_name

    # Set by the advantage step when the mechanism asks for staged updates; taken by the next actor update.
    pending_stages: PendingStages | None = None

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics=metrics)
        with marked_timer(MECHANISM_TIMER, self.timing_raw, color="purple"):
            return self._apply_mechanism(batch, metrics)

    def _apply_mechanism(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """Reweight the batch's advantages in TransferQueue; add the mechanism's metrics to ``metrics``.

        ``warmup_step`` counts verl's global steps (the first training step is 1).
        """
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(MECHANISM_FIELDS))
        nested_response_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        fields = {name: padded[name] for name in MECHANISM_FIELDS}

        output = self.mechanism.process(self.global_steps, fields, histograms=self.histogram_logger is not None)
        metrics.update(output.metrics)
        response_mask = fields["response_mask"].bool()
        token_probs = torch.where(response_mask, fields["old_log_probs"].float(), 0.0).exp()
        metrics.update(prob_bucket_stats(token_probs, output.advantages, response_mask))
        if self.histogram_logger is not None:
            self.histogram_logger.log(self.global_steps, output.histograms)

        self.pending_stages = None
        if output.stage_masks is not None:
            self.pending_stages = PendingStages(
                tuple(batch.keys), output.advantages, list(output.stage_masks), nested_response_mask
            )
        return put_advantages(batch, output.advantages, nested_response_mask)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update, once per stage of a staged mechanism (see the module docstring)."""
        stages, self.pending_stages = self.pending_stages, None
        if stages is None:
            batch = super()._update_actor(batch, metrics=metrics)
            metrics[keys.UPDATE_STAGES] = 1.0
            return batch
        if stages.keys != tuple(batch.keys):
            raise RuntimeError(
                "the actor update got a different batch (or order) than the advantage step that computed its "
                f"stages: {len(batch.keys)} keys vs {len(stages.keys)}"
            )
        # The workers read the advantages from TransferQueue by key, so each stage overwrites them there and passes
        # the same batch handle on, as verl's own _update_actor does.
        per_stage = []
        for stage_mask in stages.stage_masks:
            stage_advantages = torch.where(stage_mask, stages.advantages, 0.0).to(stages.advantages.dtype)
            put_advantages(batch, stage_advantages, stages.nested_response_mask)
            stage_metrics: dict = {}
            super()._update_actor(batch, metrics=stage_metrics)
            per_stage.append(stage_metrics)
        put_advantages(batch, stages.advantages, stages.nested_response_mask)
        metrics.update(merge_stage_metrics(per_stage))
        metrics[keys.UPDATE_STAGES] = float(len(stages.stage_masks))
        return batch


def put_advantages(batch: KVBatchMeta, advantages: torch.Tensor, nested_response_mask: torch.Tensor) -> KVBatchMeta:
    """Write padded ``(bs, L)`` advantages to TransferQueue as the jagged ``(bs, j)`` field ``advantages``."""
    nested = response_to_nested(advantages, nested_response_mask)
    return tq.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict({"advantages": nested}, batch_size=len(batch)),
    )
