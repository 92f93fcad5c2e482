"""SFT warm start on generated solved problems, cached under a hash of the model, task and SFT configs."""

from __future__ import annotations

import dataclasses
import hashlib
import functools
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import filelock
import numpy as np
import torch

from dataflex_rl.hashing import stable_hash
from dataflex_rl.tinylm.decoder import supported
from dataflex_rl.tinylm.model import build_model, load_model
from dataflex_rl.tinylm.progress import progress_bar
from dataflex_rl.tinylm.sequences import (SequenceBatch, decode_responses, encode_prompts, generate, pad_rows,
                                          response_token_outputs)
from dataflex_rl.tinylm.tokenizer import Tokenizer
from dataflex_rl.tasks import Task
from dataflex_rl.tracking.run_store import file_mode, numeric_environment
from dataflex_rl.tracking.run_store.files import read_json_object
from dataflex_rl.tracking.run_store.schema import SFT_DONE, SFT_DONE_FILE, check_schema

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # bump when the SFT recipe changes, so stale checkpoints are not reused


def sft_cache_key(model: Any, task: Any, sft: Any) -> str:
    """Stable hash of the model, task and sft blocks (not ``cache_dir``), the cache version, torch's CPU kernels and,
    for a model loaded from ``model.path``, the checkpoint's content (its files' hashes), not the path's text.
    Without a target the stopping rule's other settings change nothing: they are left out, so the key of a
    fixed-length warm start does not move with them."""
    rule = ("target_accuracy", "check_every", "check_size")
    ignored = {"cache_dir", *(rule if sft.target_accuracy is None else ())}
    return stable_hash({
        "version": CACHE_VERSION,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "model": dataclasses.asdict(model),
        "model_files": None if model.path is None else files_digest(Path(model.path)),
        "task": {"name": task.name, "params": dict(task.params)},
        "sft": {key: value for key, value in dataclasses.asdict(sft).items() if key not in ignored},
    })


def files_digest(folder: Path) -> dict[str, str]:
    """``{file name: sha256}`` of the files directly in ``folder`` (a checkpoint: config, weights, tokenizer)."""
    return {path.name: hashlib.file_digest(path.open("rb"), "sha256").hexdigest()
            for path in sorted(folder.iterdir()) if path.is_file() and path.name != SFT_DONE_FILE}


def cached_entry(directory: Path) -> bool:
    """Whether ``directory`` holds a whole warm start: ``done.json`` read by its schema, and every file it lists
    holding the content it recorded (a cut or replaced file makes the entry not cached, so it is built again)."""
    try:
        done = check_schema(directory / SFT_DONE_FILE, read_json_object(directory / SFT_DONE_FILE) or {}, SFT_DONE)
    except (OSError, ValueError):
        return False
    recorded = done.get("files")
    return isinstance(recorded, dict) and bool(recorded) and files_digest(directory) == recorded


def warm_start(model_config: Any, task_config: Any, sft: Any,
               task: Task) -> tuple[torch.nn.Module, Tokenizer, Path | None]:
    if sft.steps == 0:
        return (*build_model(model_config, task.alphabet, seed=sft.seed), None)
    directory = Path(sft.cache_dir) / sft_cache_key(model_config, task_config, sft)
    if not cached_entry(directory):  # a whole entry is read without its lock (a read-only cache serves too)
        try:
            lock = filelock.UnixFileLock(directory.with_suffix(".lock"), preserve_lock_file=True,
                                         fallback_to_soft=False)
            lock.acquire()
        except OSError as error:
            reason = error.strerror or error
            raise SFTCacheError(f"sft.cache_dir = {sft.cache_dir!r} cannot hold a new warm start ({reason}): give a "
                                f"writable sft.cache_dir") from None
        try:
            if not cached_entry(directory):
                if directory.exists():
                    log.warning("SFT warm-start cache %s is not whole (a file is missing, cut or changed): "
                                "building it again", directory)
                _train_and_save(model_config, sft, task, directory)
        finally:
            lock.release()
    else:
        log.info("SFT warm start from cache %s", directory)
    try:
        model, tokenizer = load_model(directory)
    except Exception as error:  # noqa: BLE001  (any reader error means the same: the cached files are damaged)
        raise SFTCacheError(
            f"the SFT warm-start cache {directory} cannot be read ({type(error).__name__}: {error}); it is damaged: "
            f"delete it (rm -r {directory}) and the next run rebuilds it") from error
    return model, tokenizer, directory


def warm_start_outcome(directory: Path | None) -> dict[str, Any]:
    """A cached warm start's :class:`SFTOutcome` fields from its done.json (the runs record it); ``{}`` without SFT."""
    if directory is None:
        return {}
    done = read_json_object(directory / SFT_DONE_FILE) or {}
    return {field: done.get(field) for field in SFTOutcome._fields if field != "final_loss"}


class SFTCacheError(RuntimeError):
    """A cached SFT checkpoint that cannot be loaded; the message names the folder and how to rebuild it."""


def _train_and_save(model_config: Any, sft: Any, task: Task, directory: Path) -> None:
    """Build the warm start, write it beside ``directory`` and rename it in: a reader sees a whole entry or none.
    Called under the entry's lock, so any ``<key>.tmp*`` folder beside it is a dead writer's, removed first."""
    for stale in directory.parent.glob(f"{directory.name}.tmp*"):
        shutil.rmtree(stale, ignore_errors=True)
    model, tokenizer = build_model(model_config, task.alphabet, seed=sft.seed)
    start = time.perf_counter()
    outcome = run_sft(model, tokenizer, task, sft)
    temporary = directory.with_name(directory.name + f".tmp{os.getpid()}")
    try:
        temporary.mkdir(parents=True)
        model.save_pretrained(str(temporary))
        tokenizer.save_pretrained(temporary)
        summary = {**outcome._asdict(), "seconds": time.perf_counter() - start, "environment": numeric_environment(),
                   "files": files_digest(temporary)}
        (temporary / SFT_DONE_FILE).write_text(json.dumps(summary))
        for path in temporary.iterdir():  # safetensors writes 0600 files: the shared cache readable as umask allows
            os.chmod(path, file_mode())
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(temporary, directory)
    except Exception as error:  # noqa: BLE001  (safetensors, tokenizers and the OS each raise their own kind)
        shutil.rmtree(temporary, ignore_errors=True)
        raise SFTCacheError(f"the SFT warm start could not be written to {directory} ({type(error).__name__}: "
                            f"{error}); is the disk of sft.cache_dir = {sft.cache_dir!r} full? Nothing was left "
                            f"behind") from error
    log.info("SFT done in %.1f s (%d steps, final loss %.4f), cached at %s", summary["seconds"], outcome.steps,
             outcome.final_loss, directory)


class SFTOutcome(NamedTuple):
    """What a warm start's training did (done.json): the steps it trained, and with a target its last check."""

    final_loss: float
    steps: int
    target_accuracy: float | None = None
    check_accuracy: float | None = None  # greedy accuracy on the check problems at the last check
    reached: bool | None = None  # None: no target


def check_due(steps_done: int, sft: Any) -> bool:
    """Whether the stopping rule checks after ``steps_done`` steps: every ``check_every`` steps and at the cap."""
    return sft.target_accuracy is not None and (steps_done % sft.check_every == 0 or steps_done == sft.steps)


def check_problems(task: Task, sft: Any) -> list:
    """The stopping rule's ``check_size`` problems: drawn outside the RL test pool, the same for every seed."""
    return task.draw_outside_test_pool(sft.check_size, random.Random(f"{task.name}/sft-check"), task.sample_problem)


def greedy_accuracy(model: torch.nn.Module, tokenizer: Tokenizer, task: Task, problems: list) -> float:
    training = model.training
    model.eval()
    with torch.no_grad():
        batch = generate(model, tokenizer, [problem.prompt for problem in problems], 1, task.max_new_tokens,
                         None, sampler="cached" if supported(model) is None else "hf")
    model.train(training)
    completions = decode_responses(tokenizer, batch)
    return float(np.mean([task.is_correct(problem, text) for problem, text in zip(problems, completions)]))


def run_sft(model: torch.nn.Module, tokenizer: Tokenizer, task: Task, sft: Any,
            accuracy: Callable[[], float] | None = None) -> SFTOutcome:
    """Train up to ``sft.steps`` steps; with ``sft.target_accuracy``, stop at the first check at or above it
    (``accuracy`` measures a check; default: greedy accuracy on :func:`check_problems`)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=sft.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor,
                                                                          warmup_steps=sft.warmup_steps))
    packed = supported(model) is None
    if accuracy is None and sft.target_accuracy is not None:
        problems = check_problems(task, sft)
        accuracy = functools.partial(greedy_accuracy, model, tokenizer, task, problems)
    model.train()
    loss_value, checked, steps_done = float("nan"), None, 0
    with progress_bar(total=sft.steps, desc="SFT") as bar:
        for step in range(sft.steps):
            batch = sft_batch(tokenizer, task.sft_problems(sft.batch_size, seed=sft_step_seed(sft.seed, step)))
            loss_value = sft_step(model, optimizer, batch, packed)
            schedule.step()
            steps_done = step + 1
            # every 5% (the sweep's live view reads these lines from the warm start's log)
            if steps_done % max(1, sft.steps // 20) == 0 or steps_done == sft.steps:
                log.info("SFT step %d/%d: loss %.4f", steps_done, sft.steps, loss_value)
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            if check_due(steps_done, sft):
                checked = accuracy()
                log.info("SFT check at step %d: accuracy %.3f (target %.3f)", steps_done, checked, sft.target_accuracy)
                if checked >= sft.target_accuracy:
                    break
    model.eval()
    if sft.target_accuracy is None:
        return SFTOutcome(loss_value, steps_done)
    reached = checked is not None and checked >= sft.target_accuracy
    if not reached:
        log.warning("SFT warm start did not reach target_accuracy %.3f in %d steps (last check %s)",
                    sft.target_accuracy, steps_done, "none" if checked is None else f"{checked:.3f}")
    return SFTOutcome(loss_value, steps_done, sft.target_accuracy, checked, reached)


def lr_factor(step: int, warmup_steps: int) -> float:
    """The SFT learning rate's multiplier at optimizer step ``step`` (0-based): a linear warm-up, then 1."""
    return min(1.0, (step + 1) / warmup_steps)


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: SequenceBatch, packed: bool) -> float:
    log_probs = response_token_outputs(model, batch, temperature=1.0, packed=packed).log_probs
    loss = -(log_probs * batch.response_mask).sum() / batch.response_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def sft_step_seed(seed: int, step: int) -> int:
    """Problem-draw seed of one SFT step: negative, so it never meets an RL step's seed."""
    return -(seed * 1_000_003 + step) - 1


def sft_batch(tokenizer: Tokenizer, problems) -> SequenceBatch:
    prompt_ids, prompt_mask = encode_prompts(tokenizer, [problem.prompt for problem in problems])
    responses, response_mask = pad_rows([[*tokenizer.encode(problem.completion), tokenizer.eos_token_id]
                                         for problem in problems], tokenizer.pad_token_id, left=False)
    return SequenceBatch(input_ids=torch.cat([prompt_ids, responses], dim=1),
                         attention_mask=torch.cat([prompt_mask, response_mask], dim=1), response_mask=response_mask,
                         prompt_length=prompt_ids.shape[1], group_index=np.arange(len(problems)))
