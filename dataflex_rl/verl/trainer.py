"""verl's V1 PPO trainers with the mechanism after the advantages (docs/verl.md)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.debug import marked_timer
from verl.workers.utils.padding import response_from_nested, response_to_nested

from dataflex_rl import keys
from dataflex_rl.metrics import Histogram, prob_change_stats
from dataflex_rl.run_config import environment_set
from dataflex_rl.verl.config import TRAINER_MODES, mechanism_from_verl_config, prob_change_every
from dataflex_rl.verl.histograms import WandbHistogramLogger
from dataflex_rl.verl.loss import STAGE_MASK_FIELD, staged_ppo_loss
from dataflex_rl.verl.policy_loss import mechanism_step
from dataflex_rl.verl.run_record import VerlRunRecord, run_place

# The fields every mechanism reads; only "advantages" is written back.
MECHANISM_FIELDS = ("old_log_probs", "response_mask", "advantages")
MECHANISM_TIMER = keys.TIMING_MECHANISM.removeprefix("timing_s/")


@dataclasses.dataclass(frozen=True)
class PendingChange:
    keys: tuple[str, ...]
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor


@dataclasses.dataclass
class PendingStages:
    keys: tuple[str, ...]
    advantages: torch.Tensor
    stage_masks: list[torch.Tensor]
    nested_response_mask: torch.Tensor


def merge_stage_metrics(per_stage: list[dict[str, Any]]) -> dict[str, float]:
    """Each stage's ``actor/...`` metrics as ``actor/stage<i>/...``, and every metric's mean over the stages."""
    names = dict.fromkeys(name for stage in per_stage for name in stage)
    merged = {name: float(np.mean([stage[name] for stage in per_stage if name in stage])) for name in names}
    for index, stage in enumerate(per_stage):
        merged.update({keys.stage_metric(index, name): float(value)
                       for name, value in stage.items() if name.startswith("actor/")})
    return merged


class DataflexTrainer:
    verl_mode: str = ""

    def __init__(self, config: DictConfig) -> None:
        # Validate before verl builds anything, so a bad dataflex block stops the run before any worker starts.
        self.mechanism = mechanism_from_verl_config(config)
        self.prob_change_every = prob_change_every(config)
        self.run_place = run_place(config, self.mechanism.config.mechanism)
        loggers = config["trainer"].get("logger") or []
        wandb = "wandb" in ([loggers] if isinstance(loggers, str) else list(loggers))
        self.histogram_logger = WandbHistogramLogger(self.mechanism.config.mechanism) if wandb else None
        super().__init__(config)  # type: ignore[call-arg]

    # verl's base class reads ``trainer_mode`` for mode behaviour and settings: answer the verl mode.
    @property
    def trainer_mode(self) -> str:
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, registered_name: str) -> None:
        """Ignore the registered name verl's base class assigns."""

    pending_stages: PendingStages | None = None
    pending_change: PendingChange | None = None
    prob_change_every = 0
    pending_histograms: dict[str, Histogram] = {}
    run_record: VerlRunRecord | None = None
    run_place = None
    _train_begun = False

    def _setup(self) -> None:
        super()._setup()
        if self.mechanism.staged:
            self.install_staged_loss()

    def install_staged_loss(self) -> None:
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(functools.partial(staged_ppo_loss, config=actor_config))

    def fit(self, agent_loop_manager: Any) -> None:
        if self.run_place is None:
            return super().fit(agent_loop_manager)
        self.run_record = VerlRunRecord(self.run_place, self.config, self.mechanism.config)
        # verl's fit starts W&B from these; run_identity lets analysis load verl runs from W&B with seed and axes.
        with open_dict(self.config):
            self.config.trainer.experiment_name = self.run_record.identity.wandb_name
            self.config.run_identity = self.run_record.identity.to_dict()
        self.run_record.start(self.global_steps)
        try:
            with environment_set(self.run_record.wandb_environment(os.environ)):
                super().fit(agent_loop_manager)
        except BaseException as error:
            self.run_record.finish(error)
            raise
        self.run_record.finish()

    def on_train_begin(self) -> None:
        self._train_begun = True
        super().on_train_begin()

    def _validate(self) -> dict[str, float]:
        """verl's validation; the one before training goes to the run store here."""
        val_metrics = super()._validate()
        if self.run_record is not None and not self._train_begun and self.global_steps == 0:
            self.run_record.log_step(0, val_metrics, {})
        return val_metrics

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch) -> None:
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        histograms, self.pending_histograms = self.pending_histograms, {}
        if self.run_record is not None:
            self.run_record.log_step(global_steps, metrics, histograms)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics=metrics)
        with marked_timer(MECHANISM_TIMER, self.timing_raw, color="purple"):
            return self._apply_mechanism(batch, metrics)

    def _apply_mechanism(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        names = [*MECHANISM_FIELDS, *sorted(self.mechanism.required_fields - set(MECHANISM_FIELDS))]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
        nested_response_mask = data["response_mask"]
        padded = data.to_padded_tensor()
        fields = {name: padded[name] for name in names}

        self.pending_change = None
        if self.prob_change_every and self.global_steps % self.prob_change_every == 0:
            self.pending_change = PendingChange(tuple(batch.keys), fields["old_log_probs"], fields["advantages"],
                                                fields["response_mask"].bool())
        want_histograms = self.histogram_logger is not None or self.run_record is not None
        output, step_metrics = mechanism_step(self.mechanism, self.global_steps, fields, histograms=want_histograms)
        metrics.update(step_metrics)
        if self.histogram_logger is not None:
            self.histogram_logger.log(self.global_steps, output.histograms)
        # separate_async runs the advantage step once per mini-batch of a step: the step's histograms add up.
        self.pending_histograms = merge_histograms(self.pending_histograms, output.histograms)

        self.pending_stages = None
        if output.stage_masks is not None:
            self.pending_stages = PendingStages(tuple(batch.keys), output.advantages, list(output.stage_masks),
                                                nested_response_mask)
        return put_response_fields(batch, nested_response_mask, advantages=output.advantages)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = self.update_in_stages(batch, metrics)
        change, self.pending_change = self.pending_change, None
        if change is not None:
            metrics.update(self.probability_changes(batch, change))
        return batch

    def probability_changes(self, batch: KVBatchMeta, change: PendingChange) -> dict[str, float]:
        check_same_batch(change.keys, batch)
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})
        self.actor_rollout_wg.compute_log_prob(batch)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "response_mask"])
        data["new_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])
        new_log_probs = data.to_padded_tensor()["new_log_probs"]
        return prob_change_stats(change.old_log_probs, new_log_probs, change.advantages, change.response_mask)

    def update_in_stages(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        stages, self.pending_stages = self.pending_stages, None
        if stages is None:
            batch = super()._update_actor(batch, metrics=metrics)
            metrics[keys.UPDATE_STAGES] = 1.0
            return batch
        check_same_batch(stages.keys, batch)
        # The workers read the fields the handle lists, so each stage passes the handle put returned.
        per_stage = []
        for stage_mask in stages.stage_masks:
            stage_advantages = torch.where(stage_mask, stages.advantages, 0.0).to(stages.advantages.dtype)
            stage_batch = put_response_fields(batch, stages.nested_response_mask, advantages=stage_advantages,
                                              **{STAGE_MASK_FIELD: stage_mask.to(stages.nested_response_mask.dtype)})
            stage_metrics: dict = {}
            super()._update_actor(stage_batch, metrics=stage_metrics)
            per_stage.append(stage_metrics)
        put_response_fields(batch, stages.nested_response_mask, advantages=stages.advantages)
        metrics.update(merge_stage_metrics(per_stage))
        metrics[keys.UPDATE_STAGES] = float(len(stages.stage_masks))
        return batch


class DataflexSyncTrainer(DataflexTrainer, PPOTrainerSync):
    verl_mode = "sync"


class DataflexColocateAsyncTrainer(DataflexTrainer, PPOTrainerColocateAsync):
    verl_mode = "colocate_async"


class DataflexSeparateAsyncTrainer(DataflexTrainer, PPOTrainerSeparateAsync):
    verl_mode = "separate_async"


TRAINERS: dict[str, type[DataflexTrainer]] = {
    cls_name: cls
    for cls in (DataflexSyncTrainer, DataflexColocateAsyncTrainer, DataflexSeparateAsyncTrainer)
    for cls_name, mode in TRAINER_MODES.items() if mode == cls.verl_mode
}
if set(TRAINERS) != set(TRAINER_MODES):
    raise ImportError(f"dataflex trainers {sorted(TRAINERS)} do not cover the modes {sorted(TRAINER_MODES)}")
for _name, _cls in TRAINERS.items():
    register_trainer(_name)(_cls)


def check_same_batch(advantage_keys: tuple[str, ...], batch: KVBatchMeta) -> None:
    if advantage_keys != tuple(batch.keys):
        raise RuntimeError(f"the actor update got a different batch (or order) than the advantage step: "
                           f"{len(batch.keys)} keys vs {len(advantage_keys)}")


def merge_histograms(held: Mapping[str, Histogram], new: Mapping[str, Histogram]) -> dict[str, Histogram]:
    merged = dict(held)
    for name, value in new.items():
        if name in merged:
            if not np.array_equal(merged[name].edges, value.edges):
                raise ValueError(f"histogram {name}: the mini-batches' bin edges differ")
            value = Histogram(value.edges, merged[name].counts + value.counts)
        merged[name] = value
    return merged


def put_response_fields(batch: KVBatchMeta, nested_response_mask: torch.Tensor, **fields: torch.Tensor) -> KVBatchMeta:
    nested = {name: response_to_nested(values, nested_response_mask) for name, values in fields.items()}
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                           fields=TensorDict(nested, batch_size=len(batch)))
