"""``dataflex_sync``: verl 0.9.1's V1 synchronous PPO trainer with the dataflex mechanism after the advantages.

verl has no hook between computing advantages and updating the actor, so this subclass overrides
``_compute_advantage``: verl computes the advantages (and, with rollout correction, ``rollout_is_weights``) as
usual, then :meth:`DataflexSyncTrainer._apply_mechanism` reads ``old_log_probs``, ``response_mask`` and
``advantages`` for the whole batch from TransferQueue, calls ``Mechanism.process`` once (so the weights are
mean-normalised over the batch, not per micro-batch) and writes only ``advantages`` back. ``rollout_is_weights``
is never read or written: verl's policy loss multiplies it in, so the two compose.

Shapes: TransferQueue holds each response field as a jagged nested tensor ``(bs, j)``; the mechanism sees the
padded ``(bs, L)`` tensors (``L`` = longest response in the batch, padding 0, ``response_mask`` 0 there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    block is missing or the mechanism needs staged policy updates (verl runs one update per batch).
    """
    block = config.get("dataflex") if isinstance(config, (DictConfig, Mapping)) else None
    if block is None:
        raise ConfigError(
            f"dataflex: missing; trainer.v1.trainer_mode={TRAINER_NAME} needs a dataflex block on the verl "
            f"command line, e.g. {EXAMPLE_OVERRIDES}"
        )
    mechanism = build_mechanism(to_plain(block))
    if type(mechanism).stage_masks is not Mechanism.stage_masks:
        raise ConfigError(
            f"dataflex.mechanism = {mechanism.config.mechanism!r} is not allowed with verl: it updates the policy "
            f"in stages, and verl's actor runs one update per batch; use the local backend for it"
        )
    return mechanism


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

        advantages = response_to_nested(output.advantages, nested_response_mask)
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"advantages": advantages}, batch_size=len(batch)),
        )
