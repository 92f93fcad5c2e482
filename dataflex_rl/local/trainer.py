"""GRPO on the CPU with the dataflex mechanism, one named method per stage of a step.

    rollout -> reward -> advantage -> old log-probs -> reweight (mechanism) -> update -> log

The math is verl's own (``verl.trainer.ppo.core_algos``: advantage estimators, policy losses, ``agg_loss``,
``kl_penalty``); the mechanism is the shared :class:`dataflex_rl.Mechanism`. The trainer never branches on
mechanism names: a staged mechanism (e.g. Lopti) hands over its stage masks and the update loops over them.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

from dataflex_rl import keys, metrics as mechanism_metrics
from dataflex_rl.interrupts import held_interrupts
from dataflex_rl.local.config import TrainConfig
from dataflex_rl.local.decoder import supported as decoder_supported
from dataflex_rl.local.progress import progress_bar, show_latest
from dataflex_rl.local.sequences import SequenceBatch, decode_responses, generate, response_token_outputs
from dataflex_rl.local.tokenizer import Tokenizer
from dataflex_rl.mechanism import Mechanism, MechanismOutput
from dataflex_rl.tasks import Problem, Task
from dataflex_rl.tracking.run_store import atomic_path
from dataflex_rl.validation import SEED_MODULUS

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "last.pt"
VAL_CHUNK = 256


@dataclass
class Rollout:
    """One step's sampled batch: sequences, the problems (one per sequence) and decoded completions."""

    batch: SequenceBatch
    problems: list[Problem]
    completions: list[str]


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step: resuming at step ``s`` replays exactly what an uninterrupted run does. One to one in
    ``seed`` over the seeds the config allows (:func:`~dataflex_rl.validation.check_seed`)."""
    return (seed * 1_000_003 + step) % SEED_MODULUS


def fast_paths(model: torch.nn.Module, trainer) -> tuple[str, bool]:
    """``(sampler, pack)`` the trainer uses: the configured ones, falling back to HF ``generate`` and HF's padded
    forward (with a log line saying why) for a model the project's decoder does not cover."""
    reason = decoder_supported(model)
    if reason is None:
        return trainer.sampler, trainer.pack
    if trainer.sampler != "hf" or trainer.pack:
        log.info("HF generate and HF's padded forward for this model: the fast decoder does not cover %s", reason)
    return "hf", False


class GRPOTrainer:
    """GRPO on the local backend, one named step at a time: rollout, reward, advantages, reweight (the
    mechanism), update, statistics, log; evaluation and checkpoints around them (:meth:`fit`)."""

    def __init__(
        self,
        config: TrainConfig,
        task: Task,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        mechanism: Mechanism,
        loggers,
        checkpoint_dir: Path,
    ) -> None:
        self.config = config
        self.trainer = config.trainer
        self.task = task
        self.model = model
        self.tokenizer = tokenizer
        self.mechanism = mechanism
        self.loggers = loggers
        self.checkpoint_dir = checkpoint_dir
        trainer = config.trainer
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=trainer.lr, weight_decay=trainer.weight_decay)
        self.reference = copy.deepcopy(model).eval().requires_grad_(False) if trainer.kl_coef > 0 else None
        self.actor_config = ActorConfig(
            strategy="fsdp",
            ppo_mini_batch_size=max(1, trainer.prompts_per_step // trainer.ppo_mini_batches),
            ppo_micro_batch_size_per_gpu=trainer.batch_size,
            rollout_n=trainer.rollouts_per_prompt,
            clip_ratio=trainer.clip_ratio_low,
            clip_ratio_low=trainer.clip_ratio_low,
            clip_ratio_high=trainer.clip_ratio_high,
            clip_ratio_c=trainer.clip_ratio_c,
            loss_agg_mode=trainer.loss_agg_mode,
        )
        self.algo_config = AlgoConfig(adv_estimator=trainer.adv_estimator, norm_adv_by_std_in_grpo=trainer.norm_adv_by_std)
        self.policy_loss_fn = core_algos.get_policy_loss_fn(trainer.policy_loss)
        self.advantage_fn = core_algos.get_adv_estimator_fn(trainer.adv_estimator)
        self.max_new_tokens = trainer.max_new_tokens or task.max_completion_chars + 2
        self.val_problems = task.test_problems(min(trainer.val_size, len(task.test_pool)), seed=trainer.val_seed)
        self.sampler, self.pack = fast_paths(model, trainer)
        self.compile = self.pack and trainer.compile
        self._last_log_seconds = 0.0
        self._pending_histograms: dict = {}  # the step's histograms, logged with its metrics

    # --- the loop ---------------------------------------------------------------------------------------------
    def fit(self, start_step: int = 0) -> dict[str, float]:
        """Train from ``start_step`` (0: fresh, after an evaluation of the warm start) to ``total_steps``."""
        total = self.trainer.total_steps
        last_metrics: dict[str, float] = {}
        if start_step == 0:
            last_metrics = self.validate()
            self.log(0, last_metrics)
        with progress_bar(total=total, desc="GRPO", initial=start_step) as bar:
            for step in range(start_step + 1, total + 1):
                step_metrics = self.train_step(step)
                if self._should_validate(step):
                    step_metrics.update(self.validate())
                # A stop (Ctrl-C, SIGTERM) waits until the step's metrics, histograms and checkpoint are written.
                with held_interrupts():
                    self.log(step, step_metrics)
                    if self.trainer.save_every and (step % self.trainer.save_every == 0 or step == total):
                        self.save_checkpoint(step)
                last_metrics = step_metrics
                bar.update(1)
                show_latest(bar, reward=step_metrics.get(keys.SCORE_MEAN), acc=step_metrics.get(keys.VAL_ACCURACY))
        return last_metrics

    def train_step(self, step: int) -> dict[str, float]:
        """One GRPO step (rollout to update) at ``step``; returns its metrics (histograms wait for :meth:`log`)."""
        start = time.perf_counter()
        self._seed_step(step)
        rollout = self.rollout(step)
        generated = time.perf_counter()
        scores = self.reward(rollout)
        advantages = self.compute_advantages(rollout.batch, scores)
        old_log_probs, old_entropy, reference_log_probs = self.compute_old_log_probs(rollout.batch)
        mechanism_start = time.perf_counter()
        output = self.reweight(step, rollout.batch, old_log_probs, advantages, old_entropy)
        mechanism_seconds = time.perf_counter() - mechanism_start
        exact_start = time.perf_counter()
        exact = self.exact_bucket_gradients(step, rollout.batch, old_log_probs, output)
        exact_seconds = time.perf_counter() - exact_start
        update_start = time.perf_counter()
        step_metrics, grad_factor = self.update(rollout.batch, old_log_probs, reference_log_probs, output)
        update_seconds = time.perf_counter() - update_start
        stats_start = time.perf_counter()
        step_metrics.update(self.gradient_statistics(rollout.batch, old_log_probs, output, grad_factor))
        step_metrics.update(exact)
        mechanism_seconds += time.perf_counter() - stats_start
        change_start = time.perf_counter()
        step_metrics.update(self.probability_changes(step, rollout.batch, old_log_probs, advantages))
        change_seconds = time.perf_counter() - change_start
        step_metrics.update(output.metrics)
        step_metrics.update(self._rollout_metrics(rollout, scores, output.advantages))
        step_metrics.update({
            keys.TIMING_GEN: generated - start,
            keys.TIMING_UPDATE: update_seconds,
            keys.TIMING_MECHANISM: mechanism_seconds,
            keys.TIMING_LOG: self._last_log_seconds,
            keys.TIMING_EXACT_GRAD: exact_seconds,
            keys.TIMING_PROB_CHANGE: change_seconds,
            keys.TIMING_STEP: time.perf_counter() - start,
        })
        self._pending_histograms = output.histograms
        return step_metrics

    # --- stages ---------------------------------------------------------------------------------------------
    def rollout(self, step: int) -> Rollout:
        """``prompts_per_step`` fresh training problems, ``rollouts_per_prompt`` sampled responses each."""
        trainer = self.trainer
        problems = self.task.train_problems(trainer.prompts_per_step, seed=step_seed(self.config.seed, step))
        self.model.eval()
        batch = generate(self.model, self.tokenizer, [p.prompt for p in problems], trainer.rollouts_per_prompt,
                         self.max_new_tokens, trainer.temperature, sampler=self.sampler)
        per_sequence = [problem for problem in problems for _ in range(trainer.rollouts_per_prompt)]
        return Rollout(batch, per_sequence, decode_responses(self.tokenizer, batch))

    def reward(self, rollout: Rollout) -> torch.Tensor:
        """``(N,)`` float32 task rewards of the decoded completions."""
        return torch.tensor([self.task.reward(problem, completion)
                             for problem, completion in zip(rollout.problems, rollout.completions)],
                            dtype=torch.float32)

    def compute_advantages(self, batch: SequenceBatch, scores: torch.Tensor) -> torch.Tensor:
        """``(N, R)`` advantages from verl's estimator; the outcome reward sits on the last valid token."""
        response_mask = batch.response_mask.float()
        last = response_mask.sum(-1).long().clamp(min=1) - 1
        token_level_rewards = torch.zeros_like(response_mask)
        token_level_rewards[torch.arange(len(scores)), last] = scores
        available = {
            "token_level_rewards": token_level_rewards,
            "response_mask": response_mask,
            "index": batch.group_index,
            "config": self.algo_config,
            "norm_adv_by_std_in_grpo": self.trainer.norm_adv_by_std,
        }
        parameters = inspect.signature(self.advantage_fn).parameters
        accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
        kwargs = {name: value for name, value in available.items() if accepts_any or name in parameters}
        advantages, _ = self.advantage_fn(**kwargs)
        return advantages

    @torch.no_grad()
    def compute_old_log_probs(self, batch: SequenceBatch
                              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(old log-probs, old entropy, reference log-probs)``, each ``(N, R)``: the sampled tokens' log-probs and
        the entropy of their distributions under the policy before the update, and the reference's log-probs.

        The sampler here is the policy itself, so by default they come from the scores ``generate`` already
        computed; ``trainer.recompute_old_log_probs=true`` recomputes them with a forward pass, as verl does (its
        rollout engine's numerics differ from the actor's). The entropy is None for a greedy batch.
        """
        self.model.eval()
        if batch.sampling_log_probs is not None and not self.trainer.recompute_old_log_probs:
            old, entropy = batch.sampling_log_probs, batch.sampling_entropy
        else:
            outputs = response_token_outputs(self.model, batch, self.trainer.temperature, packed=self.pack)
            old, entropy = outputs.log_probs, outputs.entropy
        reference = None
        if self.reference is not None:
            reference = response_token_outputs(self.reference, batch, self.trainer.temperature,
                                               packed=self.pack).log_probs
        return old, entropy, reference

    def reweight(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 old_entropy: torch.Tensor | None = None) -> MechanismOutput:
        """The mechanism's output for the step (histograms only at steps the loggers want them); ``entropy`` is
        handed over only to a mechanism that reads it."""
        fields = {"old_log_probs": old_log_probs, "response_mask": batch.response_mask, "advantages": advantages}
        if "entropy" in self.mechanism.required_fields and old_entropy is not None:
            fields["entropy"] = old_entropy
        return self.mechanism.process(step, fields, histograms=self.loggers.wants_histogram(step))

    def update(self, batch: SequenceBatch, old_log_probs: torch.Tensor, reference_log_probs: torch.Tensor | None,
               output: MechanismOutput) -> tuple[dict[str, float], torch.Tensor]:
        """PPO epochs over prompt-group mini-batches, once per mechanism stage; verl's policy loss and agg_loss.

        Returns the update metrics and the per-token logit-gradient factor ``(N, R)`` from the first forward pass.
        """
        trainer = self.trainer
        grad_factor = torch.zeros_like(old_log_probs)
        sums: dict[str, list[float]] = defaultdict(list)
        entropy_sum, entropy_count = 0.0, 0
        stages = output.stage_masks or [None]
        self.model.train()
        for stage_index, stage_mask in enumerate(stages):
            advantages = output.advantages if stage_mask is None else torch.where(stage_mask, output.advantages, 0.0)
            for epoch in range(trainer.ppo_epochs):
                first_pass = stage_index == 0 and epoch == 0
                for rows in self._mini_batches(batch):
                    mini = batch.select(rows)
                    outputs = response_token_outputs(self.model, mini, trainer.temperature, with_grad_factor=first_pass,
                                                     packed=self.pack, compiled=self.compile)
                    mask = mini.response_mask
                    pg_loss, pg_metrics = self.policy_loss_fn(
                        old_log_prob=old_log_probs[rows], log_prob=outputs.log_probs, advantages=advantages[rows],
                        response_mask=mask, loss_agg_mode=trainer.loss_agg_mode, config=self.actor_config)
                    loss = pg_loss
                    if reference_log_probs is not None:
                        kl = core_algos.kl_penalty(outputs.log_probs, reference_log_probs[rows], trainer.kl_type)
                        if stage_mask is not None:  # each token's KL counts once per step, in its own stage
                            kl = kl * stage_mask[rows]
                        kl_loss = core_algos.agg_loss(kl, mask, trainer.loss_agg_mode)
                        loss = loss + trainer.kl_coef * kl_loss
                        sums[keys.KL_LOSS].append(kl_loss.item())
                    norm = self._optimizer_step(loss)
                    sums[keys.SKIPPED_UPDATE_FRAC].append(float(not math.isfinite(norm)))
                    sums[keys.PG_LOSS].append(pg_loss.item())
                    sums[keys.GRAD_NORM].append(norm)
                    clip = trainer.grad_clip or float("inf")
                    sums[keys.GRAD_NORM_CLIPPED].append(min(norm, clip))
                    sums[keys.GRAD_CLIP_FRAC].append(float(norm > clip))
                    sums[keys.PG_CLIPFRAC].append(pg_metrics.get("actor/pg_clipfrac", 0.0))
                    sums[keys.PPO_KL].append(pg_metrics.get("actor/ppo_kl", 0.0))
                    if first_pass:
                        grad_factor[rows] = outputs.logit_grad_factor
                        entropy_sum += float((outputs.entropy * mask).sum())
                        entropy_count += int(mask.sum())
        self.model.eval()
        result = {key: float(np.mean(values)) for key, values in sums.items()}
        result[keys.ENTROPY] = entropy_sum / max(entropy_count, 1)
        result[keys.LR] = self.optimizer.param_groups[0]["lr"]
        result[keys.UPDATE_STAGES] = float(len(stages))
        return result, grad_factor

    def _optimizer_step(self, loss: torch.Tensor) -> float:
        """Backward, clip to ``grad_clip`` and step; returns the gradient norm before clipping.

        As verl does, a non-finite norm skips the optimiser step instead of corrupting the weights.
        """
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.trainer.grad_clip or float("inf")))
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return norm

    def gradient_statistics(self, batch: SequenceBatch, old_log_probs: torch.Tensor, output: MechanismOutput,
                            grad_factor: torch.Tensor) -> dict[str, float]:
        """Gradient norms by token-probability bucket (``grad_norm/by_prob/...``), every step, in closed form:
        ``|A w| sqrt((1 - p_y)^2 + sum_{j != y} p_j^2)`` is the norm of a token's policy-gradient loss with respect
        to its logits (at ratio 1), from the softmax the update's first forward pass already computed."""
        weighted = output.advantages.float()
        per_token = {"logit_grad_norm": weighted.abs() * grad_factor}
        return mechanism_metrics.prob_bucket_stats(old_log_probs.exp(), weighted, batch.response_mask,
                                                   self.config.stats.bucket_edges, per_token_grad_norms=per_token)

    @torch.no_grad()
    def probability_changes(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor,
                            advantages: torch.Tensor) -> dict[str, float]:
        """Every ``stats.prob_change_every`` steps: how the step's update moved each token's ``pi``
        (:func:`dataflex_rl.metrics.prob_change_stats`), from one forward pass of the updated policy over the batch;
        ``advantages`` are the ones before the mechanism (their sign is the direction a token should move)."""
        every = self.config.stats.prob_change_every
        if not every or step % every:
            return {}
        self.model.eval()
        new_log_probs = response_token_outputs(self.model, batch, self.trainer.temperature, packed=self.pack).log_probs
        return mechanism_metrics.prob_change_stats(old_log_probs, new_log_probs, advantages, batch.response_mask,
                                                   self.config.stats.bucket_edges)

    def exact_bucket_gradients(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor,
                               output: MechanismOutput) -> dict[str, float]:
        """Every ``stats.exact_every`` steps: the exact parameter-gradient norm of the loss restricted to each
        probability bucket, at the pre-update policy, on a subsample of ``stats.exact_samples`` sequences (one
        backward per bucket). The share is each bucket's norm over the sum of the buckets' norms."""
        every = self.config.stats.exact_every
        if not every or step % every:
            return {}
        count = min(self.config.stats.exact_samples, batch.input_ids.shape[0])
        rows = torch.linspace(0, batch.input_ids.shape[0] - 1, count).round().long().unique()
        mini = batch.select(rows)
        mask = mini.response_mask.bool()
        token_probs = old_log_probs[rows].exp()
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.model.eval()
        outputs = response_token_outputs(self.model, mini, self.trainer.temperature, packed=self.pack)
        norms = {}
        for low, high, label in mechanism_metrics.bucket_edges(self.config.stats.bucket_edges):
            in_bucket = mask & (token_probs >= low) & ((token_probs <= high) if high == 1.0 else (token_probs < high))
            advantages = torch.where(in_bucket, output.advantages[rows].float(), 0.0)
            loss, _ = self.policy_loss_fn(old_log_prob=old_log_probs[rows], log_prob=outputs.log_probs,
                                          advantages=advantages, response_mask=mini.response_mask,
                                          loss_agg_mode=self.trainer.loss_agg_mode, config=self.actor_config)
            gradients = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
            norms[label] = float(torch.sqrt(sum((g.float() ** 2).sum() for g in gradients if g is not None)))
        total = sum(norms.values())
        result = {}
        for label, norm in norms.items():
            result[keys.grad_by_prob(label, "param_grad_norm")] = norm
            result[keys.grad_by_prob(label, "param_grad_share")] = norm / total if total else 0.0
        return result

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out problems, overall and per difficulty (``val/accuracy/d<k>``)."""
        self.model.eval()
        correct_by_difficulty: dict[int, list[bool]] = defaultdict(list)
        for start in range(0, len(self.val_problems), VAL_CHUNK):
            problems = self.val_problems[start:start + VAL_CHUNK]
            batch = generate(self.model, self.tokenizer, [p.prompt for p in problems], 1, self.max_new_tokens, None,
                             sampler=self.sampler)
            for problem, completion in zip(problems, decode_responses(self.tokenizer, batch)):
                correct_by_difficulty[problem.difficulty].append(self.task.is_correct(problem, completion))
        all_correct = [value for values in correct_by_difficulty.values() for value in values]
        result = {keys.VAL_ACCURACY: float(np.mean(all_correct))}
        for difficulty, values in sorted(correct_by_difficulty.items()):
            result[keys.val_accuracy_by_difficulty(difficulty)] = float(np.mean(values))
        return result

    # --- logging, checkpoints -------------------------------------------------------------------------------
    def log(self, step: int, step_metrics: dict[str, float]) -> None:
        """Hand the step's metrics and pending histograms to the loggers; times itself for the next step."""
        start = time.perf_counter()
        self.loggers.log_metrics(step, step_metrics)
        for name, histogram in self._pending_histograms.items():
            self.loggers.log_histogram(step, name, histogram.edges.tolist(), histogram.counts.tolist())
        self._pending_histograms = {}
        self._last_log_seconds = time.perf_counter() - start

    def save_checkpoint(self, step: int) -> None:
        """``checkpoints/last.pt``: model, optimiser, RNG states and step, written atomically."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }
        # The temp file is removed on any error (a full disk too), so a failed save never blocks a retry.
        with atomic_path(self.checkpoint_dir / CHECKPOINT_FILE) as temporary, open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())  # a machine crash must not leave a truncated last.pt behind the rename

    def load_checkpoint(self) -> int:
        """Restore the last checkpoint if there is one; returns its step (0 when there is none)."""
        path = self.checkpoint_dir / CHECKPOINT_FILE
        if not path.exists():
            return 0
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as error:  # torch raises RuntimeError, EOFError or UnpicklingError for a damaged file
            raise RuntimeError(f"checkpoint {path} cannot be read ({type(error).__name__}: {error}); it is damaged: "
                               f"delete it to restart this run from step 0") from error
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        return int(state["step"])

    # --- helpers --------------------------------------------------------------------------------------------
    def _seed_step(self, step: int) -> None:
        seed = step_seed(self.config.seed, step)
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    def _should_validate(self, step: int) -> bool:
        every = self.trainer.val_every
        return step == self.trainer.total_steps or (every > 0 and step % every == 0)

    def _mini_batches(self, batch: SequenceBatch) -> list[torch.Tensor]:
        """Row indices of each mini-batch: whole prompt groups, shuffled (by the step's seeded RNG)."""
        groups = int(batch.group_index.max()) + 1
        order = torch.randperm(groups)
        group_index = torch.as_tensor(batch.group_index)
        return [torch.nonzero(torch.isin(group_index, chunk)).squeeze(-1)
                for chunk in torch.tensor_split(order, self.trainer.ppo_mini_batches)]

    def _rollout_metrics(self, rollout: Rollout, scores: torch.Tensor, advantages: torch.Tensor) -> dict[str, float]:
        mask = rollout.batch.response_mask.bool()
        valid_advantages = advantages[mask].float()
        correct = [self.task.is_correct(p, c) for p, c in zip(rollout.problems, rollout.completions)]
        return {
            keys.SCORE_MEAN: float(scores.mean()),
            keys.SCORE_MAX: float(scores.max()),
            keys.SCORE_MIN: float(scores.min()),
            keys.ADV_MEAN: float(valid_advantages.mean()) if valid_advantages.numel() else 0.0,
            keys.ADV_MAX: float(valid_advantages.max()) if valid_advantages.numel() else 0.0,
            keys.ADV_MIN: float(valid_advantages.min()) if valid_advantages.numel() else 0.0,
            keys.RESPONSE_LENGTH_MEAN: float(mask.sum(-1).float().mean()),
            keys.TRAIN_ACCURACY: float(np.mean(correct)),
        }
