"""The dataflex trainers: verl 0.9.1's V1 PPO trainers with the dataflex mechanism after the advantages.

One :class:`DataflexTrainer` mixed into each of verl's V1 trainers, registered as ``dataflex_sync``
(``PPOTrainerSync``), ``dataflex_colocate_async`` (``PPOTrainerColocateAsync``) and ``dataflex_separate_async``
(``PPOTrainerSeparateAsync``): :data:`dataflex_rl.verl.command.TRAINER_MODES`. Each answers ``self.trainer_mode``
with its verl mode, so verl's base class runs that mode. The asynchronous modes train on batches sampled before
the last update; the mechanism reads the ``old_log_probs`` verl computed for its PPO ratio (the current actor's, or
separate_async's start-of-cycle actor; the rollout's under bypass mode), see docs/verl.md. separate_async runs the
advantage step once per mini-batch (``parameter_sync_step`` per step): the mechanism then works per mini-batch, and
the step's histograms are their sum.

verl has no hook between computing advantages and updating the actor, so the trainer overrides
``_compute_advantage``: verl computes the advantages (and, with rollout correction, ``rollout_is_weights``) as
usual, then :meth:`DataflexTrainer._apply_mechanism` reads ``old_log_probs``, ``response_mask`` and
``advantages`` (and ``entropy``, which verl writes next to ``old_log_probs``, for a mechanism whose scorer reads it)
for the whole batch from TransferQueue, calls ``Mechanism.process`` once (so the weights are
mean-normalised over the batch, not per micro-batch) and writes only ``advantages`` back. ``rollout_is_weights``
is never read or written: verl's policy loss multiplies it in, so the two compose.

A staged mechanism (Lopti, ``dataflex.mechanism=isolate``) hands over its stage masks; ``_update_actor`` then runs
verl's actor update once per stage, each time with ``advantages`` = the reweighted advantages on the stage's tokens
and 0 elsewhere, the stage's mask in the field ``dataflex_stage_mask``, and ``old_log_probs`` untouched between the
stages. The actor's loss is :func:`dataflex_rl.verl.loss.staged_ppo_loss` (installed on the workers with verl's
``set_loss_fn``): verl's ``ppo_loss`` with the KL and entropy terms over the stage's tokens only, every term
normalised over all response tokens, as the paper's code (``kl_entropy_mask``) does. Afterwards the full reweighted
advantages are written back, so verl's step metrics see them. Each stage's actor metrics are reported as
``actor/stage<i>/<name>``; the merged ``actor/<name>`` is their mean (as in the paper's code), plus
``actor/update_stages``.

With ``+dataflex_stats.prob_change_every=N`` (default 0: off) the trainer measures every N global steps how the
step's update moved each token's probability (:func:`dataflex_rl.metrics.prob_change_stats`, the same
``prob_change/...`` metrics as the local backend), from one more ``compute_log_prob`` pass of the updated actor over
the batch.

With a ``dataflex_run.dir`` in the config the trainer also writes the project's run store
(:mod:`dataflex_rl.verl.run_record`), so the analysis reads verl runs like local ones, and gives verl's W&B run the
run's identity (name, group, job type, tags) before verl's ``fit`` opens it.

Shapes: TransferQueue holds each response field as a jagged nested tensor ``(bs, j)``; the mechanism sees the
padded ``(bs, L)`` tensors (``L`` = longest response in the batch, padding 0, ``response_mask`` 0 there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
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
from dataflex_rl.validation import ConfigError, check_keys, check_non_negative_int, to_plain
from dataflex_rl.config import build_mechanism
from dataflex_rl.mechanism import Mechanism
from dataflex_rl.metrics import Histogram, prob_bucket_stats, prob_change_stats
from dataflex_rl.verl.histograms import WandbHistogramLogger
from dataflex_rl.verl.command import DEFAULT_TRAINER_MODE, TRAINER_MODE_KEY, TRAINER_MODES
from dataflex_rl.verl.loss import STAGE_MASK_FIELD, staged_loss_function
from dataflex_rl.verl.run_record import VerlRunRecord, run_place

# The fields every mechanism reads (verl's TransferQueue names); a scorer may add its own (``entropy``), read through
# ``Mechanism.required_fields``. Only "advantages" is written back.
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
    block is missing, or when a staged mechanism meets a moving LR schedule or distillation.
    """
    block = config.get("dataflex") if isinstance(config, (DictConfig, Mapping)) else None
    if block is None:
        raise ConfigError(
            f"dataflex: missing; {TRAINER_MODE_KEY}={trainer_mode_of(config)} needs a dataflex block on the verl "
            f"command line, e.g. {EXAMPLE_OVERRIDES}"
        )
    mechanism = build_mechanism(to_plain(block))
    check_fields_available(config, mechanism)
    if is_staged(mechanism):
        check_constant_schedule(config, mechanism)
        check_no_distillation(config, mechanism)
    return mechanism


def trainer_mode_of(config: DictConfig | Mapping[str, Any]) -> str:
    """``trainer.v1.trainer_mode`` of a verl config (verl's default when unset is its own ``sync``)."""
    v1 = ((config.get("trainer") or {}).get("v1") or {}) if isinstance(config, (DictConfig, Mapping)) else {}
    return str(v1.get("trainer_mode", DEFAULT_TRAINER_MODE))


STATS_BLOCK = "dataflex_stats"
STATS_KEYS = ("prob_change_every",)


def prob_change_every(config: DictConfig | Mapping[str, Any]) -> int:
    """``dataflex_stats.prob_change_every``: every how many global steps the probability change is measured (0, the
    default when the block is absent: never; it costs one more log-prob pass of the actor over the batch)."""
    block = to_plain(config.get(STATS_BLOCK)) if isinstance(config, (DictConfig, Mapping)) else None
    if block is None:
        return 0
    if not isinstance(block, Mapping):
        raise ConfigError(f"{STATS_BLOCK} = {block!r} is not allowed: it must be a mapping with keys {STATS_KEYS}")
    check_keys(STATS_BLOCK, block, STATS_KEYS)
    return check_non_negative_int(f"{STATS_BLOCK}.prob_change_every", block.get("prob_change_every", 0))


BYPASS_KEY = "algorithm.rollout_correction.bypass_mode"


def check_fields_available(config: DictConfig | Mapping[str, Any], mechanism: Mechanism) -> None:
    """Refuse a mechanism that reads ``entropy`` when verl writes none: under ``bypass_mode`` verl's
    ``_compute_old_log_prob`` copies the rollout's log-probs and skips the pass that computes the entropy."""
    if "entropy" not in mechanism.required_fields:
        return
    correction = (config.get("algorithm") or {}).get("rollout_correction") or {}
    if correction.get("bypass_mode", False):
        raise ConfigError(
            f"{BYPASS_KEY} = True is not allowed with dataflex.scorer.name = {mechanism.config.scorer.name!r}: "
            f"under bypass mode verl computes no old-policy entropy; set {BYPASS_KEY}=False or use a scorer that "
            f"reads old_log_probs only (token_prob)"
        )


def is_staged(mechanism: Mechanism) -> bool:
    """Whether the mechanism splits the policy update in stages (:attr:`Mechanism.staged`)."""
    return type(mechanism).staged


OPTIM_PREFIX = "actor_rollout_ref.actor.optim"
# Every optimiser key through which verl 0.9.1 moves the learning rate, and the value that keeps it still.
# ``warmup_style`` is FSDP's deprecated name of ``lr_scheduler_type``: FSDPOptimizerConfig.__post_init__
# (verl/workers/config/optimizer.py) copies it over ``lr_scheduler_type`` when it is set, so it wins.
# ``lr_decay_style`` is Megatron's schedule (McoreOptimizerConfig, default "linear": it decays).
SCHEDULE_KEYS = ("warmup_style", "lr_scheduler_type", "lr_decay_style")
WARMUP_KEYS = ("lr_warmup_steps", "lr_warmup_steps_ratio")


def moving_schedule_keys(optim: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(key, value)`` of each optimiser setting that moves the learning rate during training."""
    moving = []
    if optim.get("warmup_style") is not None:
        # verl's alias: lr_scheduler_type takes warmup_style's value, so only warmup_style counts.
        if optim["warmup_style"] != "constant":
            moving.append(("warmup_style", optim["warmup_style"]))
    elif optim.get("lr_scheduler_type", "constant") not in ("constant", None):
        moving.append(("lr_scheduler_type", optim["lr_scheduler_type"]))
    if optim.get("lr_decay_style", "constant") not in ("constant", None):
        moving.append(("lr_decay_style", optim["lr_decay_style"]))
    moving += [(key, optim[key]) for key in WARMUP_KEYS if (optim.get(key) or 0) > 0]
    return moving


def check_constant_schedule(config: DictConfig | Mapping[str, Any], mechanism: Mechanism) -> None:
    """Refuse a staged mechanism with a learning-rate schedule that moves.

    Each stage is one verl actor update, and each update steps verl's LR scheduler, which verl sizes for one update
    per training step: warmup and decay would run that many times too fast.
    """
    optim = to_plain(config).get("actor_rollout_ref", {}).get("actor", {}).get("optim", {}) or {}
    moving = moving_schedule_keys(optim)
    if moving:
        key, value = moving[0]
        alias = " (verl's deprecated name of lr_scheduler_type, which it overrides)" if key == "warmup_style" else ""
        raise ConfigError(
            f"{OPTIM_PREFIX}.{key} = {value!r} is not allowed with dataflex.mechanism = "
            f"{mechanism.config.mechanism!r}{alias}: each of its update stages steps verl's LR scheduler, which verl "
            f"sizes for one update per step; use a constant schedule without warmup (lr_scheduler_type=constant, "
            f"warmup_style=null or constant, lr_decay_style=constant on Megatron, lr_warmup_steps=0, "
            f"lr_warmup_steps_ratio=0)"
        )


def check_no_distillation(config: DictConfig | Mapping[str, Any], mechanism: Mechanism) -> None:
    """Refuse a staged mechanism with on-policy distillation: verl then uses its distillation loss, which has no
    per-stage KL and entropy masks."""
    distillation = to_plain(config).get("distillation") or {}
    if isinstance(distillation, Mapping) and distillation.get("enabled"):
        raise ConfigError(
            f"distillation.enabled = True is not allowed with dataflex.mechanism = {mechanism.config.mechanism!r}: "
            f"its staged updates need the dataflex actor loss (per-stage KL and entropy), which replaces verl's "
            f"distillation loss; turn distillation off or use a single-update mechanism (reweight)"
        )


@dataclasses.dataclass(frozen=True)
class PendingChange:
    """What the advantage step keeps for the probability change: the batch's keys in order and its padded ``(bs, L)``
    old log-probs, advantages before the mechanism, and boolean response mask."""

    keys: tuple[str, ...]
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor


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
    """Each stage's ``actor/...`` metrics as ``actor/stage<i>/...``, and the mean over the stages of every metric
    under its own name (a metric missing from a stage is averaged over the others), as the paper's code merges."""
    names = dict.fromkeys(name for stage in per_stage for name in stage)
    merged = {name: float(np.mean([stage[name] for stage in per_stage if name in stage])) for name in names}
    for index, stage in enumerate(per_stage):
        merged.update(
            {keys.stage_metric(index, name): float(value) for name, value in stage.items() if name.startswith("actor/")}
        )
    return merged


def wandb_enabled(config: DictConfig | Mapping[str, Any]) -> bool:
    """Whether ``trainer.logger`` (a name or a list of names) includes ``wandb``."""
    loggers = config["trainer"].get("logger") or []
    return "wandb" in ([loggers] if isinstance(loggers, str) else list(loggers))


class DataflexTrainer:
    """``Mechanism.process`` on each batch's advantages, mixed into one of verl's V1 trainers (see the module
    docstring); :data:`TRAINERS` holds one subclass per verl mode."""

    # The verl mode this trainer runs as ("sync", "colocate_async", "separate_async").
    verl_mode: str = ""

    def __init__(self, config: DictConfig) -> None:
        # Validate before verl builds anything, so a bad dataflex block stops the run before any worker starts.
        self.mechanism = mechanism_from_verl_config(config)
        self.prob_change_every = prob_change_every(config)
        self.run_place = run_place(config, self.mechanism.config.mechanism)
        self.histogram_logger = WandbHistogramLogger(self.mechanism.config.mechanism) if wandb_enabled(config) else None
        super().__init__(config)  # type: ignore[call-arg]

    # verl's base class reads ``self.trainer_mode`` to pick the replay buffer, prompt refill and checkpoint behaviour
    # (``== "sync"``), and ``trainer.v1.<trainer_mode>`` for its settings: each trainer answers its verl mode, and the
    # registered name (``dataflex_<mode>``) stays in ``trainer.v1.trainer_mode``.
    @property
    def trainer_mode(self) -> str:
        """The verl mode: verl's base class treats this trainer as that mode's trainer."""
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, registered_name: str) -> None:
        """Keep the name verl registered the trainer under (``dataflex_<mode>``) as ``registered_name``."""
        self.registered_name = registered_name

    # Set by the advantage step when the mechanism asks for staged updates; taken by the next actor update.
    pending_stages: PendingStages | None = None
    # Set by the advantage step at a step that measures the probability change; taken after the actor update.
    pending_change: PendingChange | None = None
    prob_change_every = 0
    # The mechanism's histograms of the current step, for the run store (written with the step's metrics).
    pending_histograms: dict[str, Histogram] = {}
    # The run store (with a dataflex_run.dir); open from the start of fit to its end.
    run_record: VerlRunRecord | None = None
    run_place = None
    _train_begun = False

    # --- setup and the run store ------------------------------------------------------------------------------
    def _setup(self) -> None:
        super()._setup()
        if is_staged(self.mechanism):
            self.install_staged_loss()

    def install_staged_loss(self) -> None:
        """Give the actor workers :func:`staged_ppo_loss` (verl's ``ppo_loss`` plus per-stage KL and entropy),
        built from the same ``actor_rollout_ref.actor`` block the workers build their own loss from.

        Built here, on the driver: the worker also rescales its batch sizes in that config, which the loss does not
        read (it takes the global batch size and token count from each batch).
        """
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(staged_loss_function(actor_config))

    def fit(self, agent_loop_manager: Any) -> None:
        """verl's ``fit``, with the run store opened before it and closed after it (failed, with the traceback,
        when it raises)."""
        if self.run_place is None:
            return super().fit(agent_loop_manager)
        alpha = float(self.mechanism.config.actuator.params.get("alpha", 0.0))
        self.run_record = VerlRunRecord(self.run_place, self.config, self.mechanism.config.mechanism, alpha)
        # verl's fit starts W&B from trainer.experiment_name and the WANDB_* variables (read at W&B's first setup in
        # this process, which is verl's Tracking in fit): give it the run's identity.
        # run_identity: the same block the local backend's W&B config carries, so analysis loads verl runs from W&B
        # with their seed and axes (verl's trackers log this config); the run store's copy is already recorded.
        with open_dict(self.config):
            self.config.trainer.experiment_name = self.run_record.wandb_name
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
        """verl's hook before the first training step; from then on validations go out with their step."""
        self._train_begun = True
        super().on_train_begin()

    def _validate(self) -> dict[str, float]:
        """verl's validation; the one before training (step 0 of a fresh run) goes to the run store here, later
        ones with their step's metrics."""
        val_metrics = super()._validate()
        if self.run_record is not None and not self._train_begun and self.global_steps == 0:
            self.run_record.log_step(0, val_metrics, {})
        return val_metrics

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch) -> None:
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        histograms, self.pending_histograms = self.pending_histograms, {}
        if self.run_record is not None:
            self.run_record.log_step(global_steps, metrics, histograms)

    # --- the mechanism ------------------------------------------------------------------------------------------
    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        batch = super()._compute_advantage(batch, metrics=metrics)
        with marked_timer(MECHANISM_TIMER, self.timing_raw, color="purple"):
            return self._apply_mechanism(batch, metrics)

    def _apply_mechanism(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """Reweight the batch's advantages in TransferQueue; add the mechanism's metrics to ``metrics``.

        ``warmup_step`` counts verl's global steps (the first training step is 1).
        """
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
        output = self.mechanism.process(self.global_steps, fields, histograms=want_histograms)
        metrics.update(output.metrics)
        response_mask = fields["response_mask"].bool()
        token_probs = torch.where(response_mask, fields["old_log_probs"].float(), 0.0).exp()
        metrics.update(prob_bucket_stats(token_probs, output.advantages, response_mask))
        if self.histogram_logger is not None:
            self.histogram_logger.log(self.global_steps, output.histograms)
        # separate_async runs the advantage step once per mini-batch of a step: the step's histograms add up.
        self.pending_histograms = merge_histograms(self.pending_histograms, output.histograms)

        self.pending_stages = None
        if output.stage_masks is not None:
            self.pending_stages = PendingStages(
                tuple(batch.keys), output.advantages, list(output.stage_masks), nested_response_mask
            )
        return put_advantages(batch, output.advantages, nested_response_mask)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update (:meth:`update_in_stages`), then the probability change when the step measures it."""
        batch = self.update_in_stages(batch, metrics)
        change, self.pending_change = self.pending_change, None
        if change is not None:
            metrics.update(self.probability_changes(batch, change))
        return batch

    def probability_changes(self, batch: KVBatchMeta, change: PendingChange) -> dict[str, float]:
        """The ``prob_change/...`` metrics of the step: the updated actor's log-probs of the batch (verl's
        ``compute_log_prob``, which writes ``log_probs`` to TransferQueue) against the old ones, by the sign of the
        advantages before the mechanism."""
        if change.keys != tuple(batch.keys):
            raise RuntimeError(f"the actor update got a different batch (or order) than the advantage step: "
                               f"{len(batch.keys)} keys vs {len(change.keys)}")
        batch.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                 "temperature": self.config.actor_rollout_ref.rollout.temperature})
        self.actor_rollout_wg.compute_log_prob(batch)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["log_probs", "response_mask"])
        data["new_log_probs"] = response_from_nested(data.pop("log_probs"), data["response_mask"])
        new_log_probs = data.to_padded_tensor()["new_log_probs"]
        return prob_change_stats(change.old_log_probs, new_log_probs, change.advantages, change.response_mask)

    def update_in_stages(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
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
        # The workers read the batch from TransferQueue by key, the fields the handle lists; so each stage writes
        # its advantages and mask there and passes the handle that put returned (it lists the mask field).
        per_stage = []
        for stage_mask in stages.stage_masks:
            stage_advantages = torch.where(stage_mask, stages.advantages, 0.0).to(stages.advantages.dtype)
            stage_batch = put_stage(batch, stage_advantages, stage_mask, stages.nested_response_mask)
            stage_metrics: dict = {}
            super()._update_actor(stage_batch, metrics=stage_metrics)
            per_stage.append(stage_metrics)
        put_advantages(batch, stages.advantages, stages.nested_response_mask)
        metrics.update(merge_stage_metrics(per_stage))
        metrics[keys.UPDATE_STAGES] = float(len(stages.stage_masks))
        return batch


class DataflexSyncTrainer(DataflexTrainer, PPOTrainerSync):
    """verl's sync trainer with the mechanism (``dataflex_sync``)."""

    verl_mode = "sync"


class DataflexColocateAsyncTrainer(DataflexTrainer, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer with the mechanism (``dataflex_colocate_async``)."""

    verl_mode = "colocate_async"


class DataflexSeparateAsyncTrainer(DataflexTrainer, PPOTrainerSeparateAsync):
    """verl's separated asynchronous trainer with the mechanism (``dataflex_separate_async``)."""

    verl_mode = "separate_async"


# One registration per verl mode, under the names the command builder and the doctor accept.
TRAINERS: dict[str, type[DataflexTrainer]] = {
    cls_name: cls
    for cls in (DataflexSyncTrainer, DataflexColocateAsyncTrainer, DataflexSeparateAsyncTrainer)
    for cls_name, mode in TRAINER_MODES.items() if mode == cls.verl_mode
}
if set(TRAINERS) != set(TRAINER_MODES):
    raise ImportError(f"dataflex trainers {sorted(TRAINERS)} do not cover the modes {sorted(TRAINER_MODES)}")
for _name, _cls in TRAINERS.items():
    register_trainer(_name)(_cls)


def merge_histograms(held: Mapping[str, Histogram], new: Mapping[str, Histogram]) -> dict[str, Histogram]:
    """``held`` plus ``new``, the counts of a name in both added (their edges must be equal)."""
    merged = dict(held)
    for name, value in new.items():
        if name in merged:
            if not np.array_equal(merged[name].edges, value.edges):
                raise ValueError(f"histogram {name}: the mini-batches' bin edges differ")
            value = Histogram(value.edges, merged[name].counts + value.counts)
        merged[name] = value
    return merged


@contextlib.contextmanager
def environment_set(variables: Mapping[str, str]) -> Iterator[None]:
    """Set ``variables`` in ``os.environ`` for the block; afterwards each is restored (or removed) as before."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def put_advantages(batch: KVBatchMeta, advantages: torch.Tensor, nested_response_mask: torch.Tensor) -> KVBatchMeta:
    """Write padded ``(bs, L)`` advantages to TransferQueue as the jagged ``(bs, j)`` field ``advantages``."""
    nested = response_to_nested(advantages, nested_response_mask)
    return tq.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict({"advantages": nested}, batch_size=len(batch)),
    )


def put_stage(
    batch: KVBatchMeta, advantages: torch.Tensor, stage_mask: torch.Tensor, nested_response_mask: torch.Tensor
) -> KVBatchMeta:
    """Write one stage's padded ``(bs, L)`` advantages and its mask (field ``dataflex_stage_mask``, in
    ``response_mask``'s dtype) to TransferQueue; returns the handle listing every stored field."""
    mask_values = stage_mask.to(nested_response_mask.dtype)
    fields = {
        "advantages": response_to_nested(advantages, nested_response_mask),
        STAGE_MASK_FIELD: response_to_nested(mask_values, nested_response_mask),
    }
    return tq.kv_batch_put(
        keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch))
    )
