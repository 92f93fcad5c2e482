"""verl's V1 PPO trainers with the mechanism after the advantages (docs/verl.md). The advantage step leaves what
the actor update needs in TransferQueue beside the batch's rows, and the run store's histograms in the metrics."""

import dataclasses
import functools
import os
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
from dataflex_rl.verl.loss import STAGE_MASK_FIELD, staged_ppo_loss
from dataflex_rl.verl.policy_loss import histogram_bins, mechanism_step, pop_histograms
from dataflex_rl.verl.run_record import BACKEND, VerlRunRecord, run_place

MECHANISM_FIELDS = ("old_log_probs", "response_mask", "advantages")
MECHANISM_TIMER = keys.TIMING_MECHANISM.removeprefix("timing_s/")
# What the advantage step leaves in TransferQueue for the actor update (jagged like response_mask): stage i's tokens
# of a staged mechanism (STAGE_FIELD + i), and verl's advantages before the mechanism on a step whose probability
# change is measured. The workers fetch every field a batch handle lists, so they are handed a list without these.
CARRIED_PREFIX = "dataflex_step_"
STAGE_FIELD = f"{CARRIED_PREFIX}stage_"
BASE_ADVANTAGES_FIELD = f"{CARRIED_PREFIX}base_advantages"
# verl's MetricsAggregator sums a metric whose name holds "sum" over a step's sub-batches (parameter_sync_step), so
# separate_async's mini-batches add up their histogram bins.
HISTOGRAM_BIN_INFIX = "sum_"


class WandbHistogramLogger:
    """The mechanism's histograms to the W&B run verl opened in this process (verl's loggers take scalars only)."""

    def __init__(self, mechanism_name: str) -> None:
        self.tags = (BACKEND, mechanism_name)
        self._tagged_run_id: str | None = None

    def log(self, step: int, histograms: dict[str, Histogram]) -> None:
        import wandb

        run = wandb.run
        if run is None or not histograms:
            return
        if self._tagged_run_id != run.id:
            run.tags = tuple(dict.fromkeys([*(run.tags or ()), *self.tags]))
            self._tagged_run_id = run.id
        # W&B's np_histogram takes (counts, edges), like numpy.histogram returns them.
        wandb.log({name: wandb.Histogram(np_histogram=(hist.counts.tolist(), hist.edges.tolist()))
                   for name, hist in histograms.items()}, step=step)


def merge_stage_metrics(per_stage: list[dict[str, Any]]) -> dict[str, float]:
    """Each stage's ``actor/...`` metrics as ``actor/stage<i>/...``, and every metric's mean over the stages."""
    names = dict.fromkeys(name for stage in per_stage for name in stage)
    merged = {name: float(np.mean([stage[name] for stage in per_stage if name in stage])) for name in names}
    for index, stage in enumerate(per_stage):
        merged.update({keys.stage_metric(index, name): float(value)
                       for name, value in stage.items() if name.startswith("actor/")})
    return merged


def put_response_fields(batch: KVBatchMeta, nested_response_mask: torch.Tensor, **fields: torch.Tensor) -> KVBatchMeta:
    nested = {name: response_to_nested(values, nested_response_mask) for name, values in fields.items()}
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                           fields=TensorDict(nested, batch_size=len(batch)))


def for_workers(batch: KVBatchMeta) -> KVBatchMeta:
    if batch.fields is None:
        return batch
    return dataclasses.replace(batch, fields=[name for name in batch.fields if not name.startswith(CARRIED_PREFIX)])


class DataflexTrainer:
    verl_mode: str = ""
    # Built in __init__ from the config; the run store is open from the start of fit to its end.
    prob_change_every = 0
    run_place = None
    run_record: VerlRunRecord | None = None

    def __init__(self, config: DictConfig) -> None:
        # Validate before verl builds anything, so a bad dataflex block stops the run before any worker starts.
        self.mechanism = mechanism_from_verl_config(config)
        self.prob_change_every = prob_change_every(config)
        self.run_place = run_place(config, self.mechanism.config.mechanism)
        loggers = config["trainer"].get("logger") or []
        wandb = "wandb" in ([loggers] if isinstance(loggers, str) else loggers)
        self.histogram_logger = WandbHistogramLogger(self.mechanism.config.mechanism) if wandb else None
        super().__init__(config)  # type: ignore[call-arg]

    # verl's base class reads ``trainer_mode`` for mode behaviour and settings: answer the verl mode.
    @property
    def trainer_mode(self) -> str:
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, registered_name: str) -> None:
        """Ignore the registered name verl's base class assigns."""

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

    def _validate(self) -> dict[str, float]:
        """verl's validation; the one before training (global step 0) goes to the run store here."""
        val_metrics = super()._validate()
        if self.run_record is not None and self.global_steps == 0:
            self.run_record.log_step(0, val_metrics, {})
        return val_metrics

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch) -> None:
        histograms = pop_histograms(metrics, HISTOGRAM_BIN_INFIX)
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        if self.run_record is not None:
            self.run_record.log_step(global_steps, metrics, histograms)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics=metrics)
        with marked_timer(MECHANISM_TIMER, self.timing_raw, color="purple"):
            return self._apply_mechanism(batch, metrics)

    def _apply_mechanism(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        names = [*MECHANISM_FIELDS, *sorted(self.mechanism.required_fields - set(MECHANISM_FIELDS))]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=names)
        fields = dict(data.to_padded_tensor().items())
        want_histograms = self.histogram_logger is not None or self.run_record is not None
        output, step_metrics = mechanism_step(self.mechanism, self.global_steps, fields, histograms=want_histograms)
        metrics.update(step_metrics)
        if self.histogram_logger is not None:
            self.histogram_logger.log(self.global_steps, output.histograms)
        if self.run_record is not None:
            metrics.update(histogram_bins(output.histograms, HISTOGRAM_BIN_INFIX))
        carried = {f"{STAGE_FIELD}{index}": stage_mask.to(data["response_mask"].dtype)
                   for index, stage_mask in enumerate(output.stage_masks or ())}
        if self.prob_change_every and self.global_steps % self.prob_change_every == 0:
            carried[BASE_ADVANTAGES_FIELD] = fields["advantages"]
        return put_response_fields(batch, data["response_mask"], advantages=output.advantages, **carried)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        listed, batch = batch.fields or (), for_workers(batch)
        stages = sum(name.startswith(STAGE_FIELD) for name in listed)
        if stages:
            self.update_in_stages(batch, stages, metrics)
        else:
            batch = super()._update_actor(batch, metrics=metrics)
            metrics[keys.UPDATE_STAGES] = 1.0
        if BASE_ADVANTAGES_FIELD in listed:
            metrics.update(self.probability_changes(batch))
        return batch

    def update_in_stages(self, batch: KVBatchMeta, stages: int, metrics: dict) -> None:
        """One actor update per stage, on the stage's advantages and mask; then the queue holds all advantages."""
        stage_fields = [f"{STAGE_FIELD}{index}" for index in range(stages)]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["response_mask", "advantages", *stage_fields])
        padded = data.to_padded_tensor()
        advantages = padded["advantages"]
        per_stage = []
        for name in stage_fields:
            stage_advantages = torch.where(padded[name].bool(), advantages, 0.0).to(advantages.dtype)
            # The workers read the fields the handle lists, so each stage passes the handle put returned.
            stage_batch = put_response_fields(batch, data["response_mask"], advantages=stage_advantages,
                                              **{STAGE_MASK_FIELD: padded[name]})
            stage_metrics: dict = {}
            super()._update_actor(for_workers(stage_batch), metrics=stage_metrics)
            per_stage.append(stage_metrics)
        put_response_fields(batch, data["response_mask"], advantages=advantages)
        metrics.update(merge_stage_metrics(per_stage))
        metrics[keys.UPDATE_STAGES] = float(stages)

    def probability_changes(self, batch: KVBatchMeta) -> dict[str, float]:
        """How the update moved each token's probability: one more ``compute_log_prob`` of the updated actor."""
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})
        self.actor_rollout_wg.compute_log_prob(batch)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "old_log_probs", BASE_ADVANTAGES_FIELD, "response_mask"])
        data["new_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])
        padded = data.to_padded_tensor()
        return prob_change_stats(padded["old_log_probs"], padded["new_log_probs"], padded[BASE_ADVANTAGES_FIELD],
                                 padded["response_mask"])


class DataflexSyncTrainer(DataflexTrainer, PPOTrainerSync):
    verl_mode = "sync"


class DataflexColocateAsyncTrainer(DataflexTrainer, PPOTrainerColocateAsync):
    verl_mode = "colocate_async"


class DataflexSeparateAsyncTrainer(DataflexTrainer, PPOTrainerSeparateAsync):
    verl_mode = "separate_async"


TRAINERS: dict[str, type[DataflexTrainer]] = {
    name: register_trainer(name)(cls)
    for cls in (DataflexSyncTrainer, DataflexColocateAsyncTrainer, DataflexSeparateAsyncTrainer)
    for name, mode in TRAINER_MODES.items() if mode == cls.verl_mode
}
