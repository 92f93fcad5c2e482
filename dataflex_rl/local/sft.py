"""SFT warm start: a random tiny model solves nothing, so it first learns from generated solved problems.

The checkpoint is cached under a key hashed from the model, task and SFT configs (``sft.seed`` included, the run
seed not), so every run of a sweep starts from the same weights and SFT runs once; a file lock makes concurrent
runs wait for the one that trains instead of training it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from dataflex_rl.local.config import ModelConfig, SFTConfig, TaskConfig
from dataflex_rl.local.model import build_model, load_model
from dataflex_rl.local.progress import progress_bar
from dataflex_rl.local.decoder import supported
from dataflex_rl.local.sequences import SequenceBatch, encode_prompts, response_token_outputs
from dataflex_rl.local.tokenizer import Tokenizer
from dataflex_rl.tasks import Task
from dataflex_rl.tracking.run_store import file_mode, numeric_environment

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # bump when the SFT recipe changes, so stale checkpoints are not reused


def sft_cache_key(model: ModelConfig, task: TaskConfig, sft: SFTConfig) -> str:
    """16 hex digits of sha256 over what the warm start depends on: model, task, SFT settings (not
    ``cache_dir``), :data:`CACHE_VERSION` and torch's CPU kernel set (``ATEN_CPU_CAPABILITY`` changes the numbers:
    a warm start trained under AVX512 kernels is not reused under AVX2)."""
    payload = {
        "version": CACHE_VERSION,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "model": dataclasses.asdict(model),
        "task": {"name": task.name, "params": dict(task.params)},
        "sft": {key: value for key, value in dataclasses.asdict(sft).items() if key != "cache_dir"},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def warm_start(
    model_config: ModelConfig, task_config: TaskConfig, sft: SFTConfig, task: Task
) -> tuple[torch.nn.Module, Tokenizer, Path | None]:
    """``(model, tokenizer, checkpoint dir)`` after SFT, from the cache when it holds this key.

    ``sft.steps == 0`` skips SFT (the model as built or loaded; no checkpoint dir).
    """
    if sft.steps == 0:
        model, tokenizer = build_model(model_config, task.alphabet, seed=sft.seed)
        return model, tokenizer, None
    directory = Path(sft.cache_dir) / sft_cache_key(model_config, task_config, sft)
    with _locked(directory.with_suffix(".lock")):
        if not (directory / "done.json").exists():
            _train_and_save(model_config, sft, task, directory)
        else:
            log.info("SFT warm start from cache %s", directory)
    try:
        model, tokenizer = load_model(directory)
    except Exception as error:  # noqa: BLE001  (any reader error means the same: the cached files are damaged)
        raise SFTCacheError(
            f"the SFT warm-start cache {directory} cannot be read ({type(error).__name__}: {error}); it is damaged: "
            f"delete it (rm -r {directory}) and the next run rebuilds it") from error
    return model, tokenizer, directory


class SFTCacheError(RuntimeError):
    """A cached SFT checkpoint that cannot be loaded; the message names the folder and how to rebuild it."""


def _train_and_save(model_config: ModelConfig, sft: SFTConfig, task: Task, directory: Path) -> None:
    model, tokenizer = build_model(model_config, task.alphabet, seed=sft.seed)
    start = time.perf_counter()
    final_loss = run_sft(model, tokenizer, task, sft)
    temporary = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    model.save_pretrained(str(temporary))
    tokenizer.save_pretrained(temporary)
    summary = {"final_loss": final_loss, "steps": sft.steps, "seconds": time.perf_counter() - start,
               "environment": numeric_environment()}
    (temporary / "done.json").write_text(json.dumps(summary))
    for path in temporary.iterdir():  # safetensors writes 0600 files: make the shared cache readable as umask allows
        os.chmod(path, file_mode())
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(temporary, directory)
    log.info("SFT done in %.1f s (final loss %.4f), cached at %s", summary["seconds"], final_loss, directory)


def run_sft(model: torch.nn.Module, tokenizer: Tokenizer, task: Task, sft: SFTConfig) -> float:
    """Teacher-forced cross-entropy on ``<bos> prompt completion <eos>``, loss on completion tokens only.

    The forward pass is the RL update's (:func:`~dataflex_rl.local.sequences.response_token_outputs`): packed, no
    work on padded positions, the LM head only where a completion token is predicted (models the fast decoder
    covers; the HF forward over the padded batch otherwise)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=sft.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    packed = supported(model) is None
    model.train()
    loss_value = float("nan")
    with progress_bar(total=sft.steps, desc="SFT") as bar:
        for step in range(sft.steps):
            batch = sft_batch(tokenizer, task.train_problems(sft.batch_size, seed=sft_step_seed(sft.seed, step)))
            loss_value = sft_step(model, optimizer, batch, packed)
            schedule.step()
            # every 5% (the sweep's live view reads these lines from the warm start's log)
            if (step + 1) % max(1, sft.steps // 20) == 0 or step + 1 == sft.steps:
                log.info("SFT step %d/%d: loss %.4f", step + 1, sft.steps, loss_value)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
    model.eval()
    return loss_value


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: SequenceBatch, packed: bool) -> float:
    """One optimiser step on the mean negative log-likelihood of the batch's response tokens (gradient norm clipped
    at 1); returns the loss. ``packed``: the packed forward pass, else the HF forward over the padded batch."""
    log_probs = response_token_outputs(model, batch, temperature=1.0, packed=packed).log_probs
    loss = -(log_probs * batch.response_mask).sum() / batch.response_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def sft_step_seed(seed: int, step: int) -> int:
    """Problem-draw seed of one SFT step: negative, so it never meets an RL step's seed (``trainer.step_seed``)
    even when ``sft.seed`` equals the run seed."""
    return -(seed * 1_000_003 + step) - 1


def sft_batch(tokenizer: Tokenizer, problems) -> SequenceBatch:
    """Solved problems as a :class:`SequenceBatch`: ``<bos>`` + prompt left-padded, completion + ``<eos>`` as the
    response, right-padded (``response_mask`` 1 on the completion and its ``<eos>``)."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [problem.prompt for problem in problems])
    completions = [[*tokenizer.encode(problem.completion), tokenizer.eos_token_id] for problem in problems]
    length = max(len(completion) for completion in completions)
    responses = torch.full((len(completions), length), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((len(completions), length), dtype=torch.long)
    for row, completion in enumerate(completions):
        responses[row, : len(completion)] = torch.tensor(completion)
        response_mask[row, : len(completion)] = 1
    return SequenceBatch(input_ids=torch.cat([prompt_ids, responses], dim=1),
                         attention_mask=torch.cat([prompt_mask, response_mask], dim=1), response_mask=response_mask,
                         prompt_length=prompt_ids.shape[1], group_index=np.arange(len(completions)))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
