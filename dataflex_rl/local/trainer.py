"""GRPO on the CPU with the dataflex mechanism, one method per stage of a step; verl's ``core_algos`` math."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

from dataflex_rl import keys, metrics as mechanism_metrics
from dataflex_rl.interrupts import held_interrupts
from dataflex_rl.run_config import TrainConfig
from dataflex_rl.tinylm.decoder import supported as decoder_supported
from dataflex_rl.tinylm.progress import progress_bar, show_latest
from dataflex_rl.tinylm.sequences import SequenceBatch, decode_responses, generate, response_token_outputs
from dataflex_rl.tinylm.tokenizer import Tokenizer
from dataflex_rl.mechanism import Mechanism, MechanismOutput
from dataflex_rl.tasks import Problem, Task
from dataflex_rl.tracking.run_store import atomic_path
from dataflex_rl.validation import SEED_MODULUS

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "last.pt"
VAL_CHUNK = 256


@dataclass
class Rollout:
    batch: SequenceBatch
    problems: list[Problem]
    completions: list[str]


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of one step: a resumed run replays exactly what an uninterrupted one does."""
    return (seed * 1_000_003 + step) % SEED_MODULUS


def val_problems(task: Task, trainer) -> list:
    """The held-out problems every evaluation scores (``val/accuracy``): the test pool's first ``trainer.val_size``."""
    return task.test_problems(min(trainer.val_size, len(task.test_pool)), seed=trainer.val_seed)


def fast_paths(model: torch.nn.Module, trainer) -> tuple[str, bool]:
    reason = decoder_supported(model)
    if reason is None:
        return trainer.sampler, trainer.pack
    if trainer.sampler != "hf" or trainer.pack:
        log.info("HF generate and HF's padded forward for this model: the fast decoder does not cover %s", reason)
    return "hf", False


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def process_seconds() -> float:
    """Seconds since this process started (the interpreter's own start included)."""
    return time.time() - psutil.Process().create_time()


class GRPOTrainer:
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
        trainer = self.trainer = config.trainer
        self.task = task
        self.model = model
        self.tokenizer = tokenizer
        self.mechanism = mechanism
        self.loggers = loggers
        self.checkpoint_dir = checkpoint_dir
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
        self.algo_config = AlgoConfig(adv_estimator=trainer.adv_estimator,
                                      norm_adv_by_std_in_grpo=trainer.norm_adv_by_std)
        self.policy_loss_fn = core_algos.get_policy_loss_fn(trainer.policy_loss)
        self.advantage_fn = core_algos.get_adv_estimator_fn(trainer.adv_estimator)
        self.max_new_tokens = trainer.max_new_tokens or task.max_new_tokens
        self.val_problems = val_problems(task, trainer)
        self.sampler, self.pack = fast_paths(model, trainer)
        self.compile = self.pack and trainer.compile
        self._last_log_seconds = 0.0
        self._pending_histograms: dict = {}  # the step's histograms, logged with its metrics

    def fit(self, start_step: int = 0) -> dict[str, float]:
        total = self.trainer.total_steps
        last_metrics: dict[str, float] = {}
        startup = {keys.TIMING_STARTUP: process_seconds()}
        if start_step == 0:
            last_metrics = self.validate()
            self.log(0, last_metrics)
        with progress_bar(total=total, desc="GRPO", initial=start_step) as bar:
            for step in range(start_step + 1, total + 1):
                step_metrics = {**self.train_step(step), **startup}
                startup = {}
                if step == total or (self.trainer.val_every > 0 and step % self.trainer.val_every == 0):
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
        start = time.perf_counter()
        timings = {keys.TIMING_LOG: self._last_log_seconds}
        with timed(timings, keys.TIMING_GEN):
            seed = step_seed(self.config.seed, step)
            torch.manual_seed(seed)
            np.random.seed(seed)
            random.seed(seed)
            rollout = self.rollout(step)
        batch = rollout.batch
        scores = self.reward(rollout)
        advantages = self.compute_advantages(batch, scores)
        old_log_probs, old_entropy, reference_log_probs = self.compute_old_log_probs(batch)
        with timed(timings, keys.TIMING_MECHANISM):
            output = self.reweight(step, batch, old_log_probs, advantages, old_entropy)
        with timed(timings, keys.TIMING_EXACT_GRAD):
            exact = self.exact_bucket_gradients(step, batch, old_log_probs, output)
        with timed(timings, keys.TIMING_UPDATE):
            step_metrics, grad_factor = self.update(batch, old_log_probs, reference_log_probs, output)
        with timed(timings, keys.TIMING_MECHANISM):
            step_metrics.update(self.gradient_statistics(batch, old_log_probs, output, grad_factor))
        step_metrics.update(exact)
        with timed(timings, keys.TIMING_PROB_CHANGE):
            step_metrics.update(self.probability_changes(step, batch, old_log_probs, advantages))
        step_metrics.update(output.metrics)
        step_metrics.update(self._rollout_metrics(rollout, scores, output.advantages))
        step_metrics.update(timings)
        step_metrics[keys.TIMING_STEP] = time.perf_counter() - start
        self._pending_histograms = output.histograms
        return step_metrics

    def rollout(self, step: int) -> Rollout:
        trainer = self.trainer
        problems = self.task.train_problems(trainer.prompts_per_step, seed=step_seed(self.config.seed, step))
        self.model.eval()
        batch = generate(self.model, self.tokenizer, [p.prompt for p in problems], trainer.rollouts_per_prompt,
                         self.max_new_tokens, trainer.temperature, sampler=self.sampler)
        per_sequence = [problem for problem in problems for _ in range(trainer.rollouts_per_prompt)]
        return Rollout(batch, per_sequence, decode_responses(self.tokenizer, batch))

    def reward(self, rollout: Rollout) -> torch.Tensor:
        return torch.tensor([self.task.reward(problem, completion)
                             for problem, completion in zip(rollout.problems, rollout.completions)],
                            dtype=torch.float32)

    def compute_advantages(self, batch: SequenceBatch, scores: torch.Tensor) -> torch.Tensor:
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
        return self.advantage_fn(**kwargs)[0]

    @torch.no_grad()
    def compute_old_log_probs(self, batch: SequenceBatch
                              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        self.model.eval()
        if batch.sampling_log_probs is not None and not self.trainer.recompute_old_log_probs:
            old, entropy = batch.sampling_log_probs, batch.sampling_entropy
        else:
            outputs = response_token_outputs(self.model, batch, self.trainer.temperature, packed=self.pack)
            old, entropy = outputs.log_probs, outputs.entropy
        return old, entropy, None if self.reference is None else response_token_outputs(
            self.reference, batch, self.trainer.temperature, packed=self.pack).log_probs

    def reweight(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                 old_entropy: torch.Tensor | None = None) -> MechanismOutput:
        fields = {"old_log_probs": old_log_probs, "response_mask": batch.response_mask, "advantages": advantages}
        if "entropy" in self.mechanism.required_fields and old_entropy is not None:
            fields["entropy"] = old_entropy
        return self.mechanism.process(step, fields, histograms=self.loggers.wants_histogram(step))

    def update(self, batch: SequenceBatch, old_log_probs: torch.Tensor, reference_log_probs: torch.Tensor | None,
               output: MechanismOutput) -> tuple[dict[str, float], torch.Tensor]:
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
        weighted = output.advantages.float()
        per_token = {"logit_grad_norm": weighted.abs() * grad_factor}
        return mechanism_metrics.prob_bucket_stats(output.token_probs, weighted, batch.response_mask,
                                                   self.config.stats.bucket_edges, per_token_grad_norms=per_token)

    @torch.no_grad()
    def probability_changes(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor,
                            advantages: torch.Tensor) -> dict[str, float]:
        every = self.config.stats.prob_change_every
        if not every or step % every:
            return {}
        self.model.eval()
        new_log_probs = response_token_outputs(self.model, batch, self.trainer.temperature, packed=self.pack).log_probs
        return mechanism_metrics.prob_change_stats(old_log_probs, new_log_probs, advantages, batch.response_mask,
                                                   self.config.stats.bucket_edges)

    def exact_bucket_gradients(self, step: int, batch: SequenceBatch, old_log_probs: torch.Tensor,
                               output: MechanismOutput) -> dict[str, float]:
        every = self.config.stats.exact_every
        if not every or step % every:
            return {}
        count = min(self.config.stats.exact_samples, batch.input_ids.shape[0])
        rows = torch.linspace(0, batch.input_ids.shape[0] - 1, count).round().long().unique()
        mini = batch.select(rows)
        mask = mini.response_mask.bool()
        token_probs = output.token_probs[rows]
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.model.eval()
        outputs = response_token_outputs(self.model, mini, self.trainer.temperature, packed=self.pack)
        norms = {}
        for label, in_bucket in mechanism_metrics.bucket_masks(token_probs, self.config.stats.bucket_edges):
            advantages = torch.where(mask & in_bucket, output.advantages[rows].float(), 0.0)
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
        began = time.perf_counter()
        self.model.eval()
        correct_by_difficulty: dict[int, list[bool]] = defaultdict(list)
        for start in range(0, len(self.val_problems), VAL_CHUNK):
            problems = self.val_problems[start:start + VAL_CHUNK]
            batch = generate(self.model, self.tokenizer, [p.prompt for p in problems], 1, self.max_new_tokens, None,
                             sampler=self.sampler)
            for problem, completion in zip(problems, decode_responses(self.tokenizer, batch)):
                correct_by_difficulty[problem.difficulty].append(self.task.is_correct(problem, completion))
        all_correct = [value for values in correct_by_difficulty.values() for value in values]
        result = {keys.VAL_ACCURACY: float(np.mean(all_correct)), keys.TIMING_VAL: time.perf_counter() - began}
        for difficulty, values in sorted(correct_by_difficulty.items()):
            result[keys.val_accuracy_by_difficulty(difficulty)] = float(np.mean(values))
        return result

    def log(self, step: int, step_metrics: dict[str, float]) -> None:
        start = time.perf_counter()
        self.loggers.log_metrics(step, step_metrics)
        for name, histogram in self._pending_histograms.items():
            self.loggers.log_histogram(step, name, histogram.edges.tolist(), histogram.counts.tolist())
        self._pending_histograms = {}
        self._last_log_seconds = time.perf_counter() - start

    def save_checkpoint(self, step: int) -> None:
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }
        with atomic_path(self.checkpoint_dir / CHECKPOINT_FILE) as temporary, open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())  # a machine crash must not leave a truncated last.pt behind the rename

    def load_checkpoint(self) -> int:
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

    def _mini_batches(self, batch: SequenceBatch) -> list[torch.Tensor]:
        order = torch.randperm(int(batch.group_index.max()) + 1)
        group_index = torch.as_tensor(batch.group_index)
        return [torch.nonzero(torch.isin(group_index, chunk)).squeeze(-1)
                for chunk in torch.tensor_split(order, self.trainer.ppo_mini_batches)]

    def _rollout_metrics(self, rollout: Rollout, scores: torch.Tensor, advantages: torch.Tensor) -> dict[str, float]:
        mask = rollout.batch.response_mask.bool()
        valid_advantages = advantages[mask].float() if mask.any() else torch.zeros(1)
        correct = [self.task.is_correct(p, c) for p, c in zip(rollout.problems, rollout.completions)]
        return {
            keys.SCORE_MEAN: float(scores.mean()),
            keys.SCORE_MAX: float(scores.max()),
            keys.SCORE_MIN: float(scores.min()),
            keys.ADV_MEAN: float(valid_advantages.mean()),
            keys.ADV_MAX: float(valid_advantages.max()),
            keys.ADV_MIN: float(valid_advantages.min()),
            keys.RESPONSE_LENGTH_MEAN: float(mask.sum(-1).float().mean()),
            keys.TRAIN_ACCURACY: float(np.mean(correct)),
        }
