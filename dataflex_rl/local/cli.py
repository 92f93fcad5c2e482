"""The local CPU backend's command line, behind ``python -m dataflex_rl.train [hydra overrides]`` (the public
command, a thin module): compose ``conf/train.yaml``, refuse bad input before Hydra creates ``run_dir``, take the
run's lock, check a resume, then warm start and train (:class:`dataflex_rl.local.trainer.GRPOTrainer`).

Overrides, exit codes and the resume rules: :mod:`dataflex_rl.train`.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from dataflex_rl.validation import ConfigError, unknown_override_message

log = logging.getLogger("dataflex_rl.train")  # the public command's name, as train.log has always shown it
# verl probes optional engines (megatron, mindspeed, ...) at import and warns for each one missing on a CPU box.
warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


class _DropMessages(logging.Filter):
    """Drops log records whose message contains one of ``fragments``."""

    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


# verl's platform probe warns that no accelerator is registered and blames "a CPU-only ray actor": on the local
# backend there is no Ray actor and the CPU is the intended device, so both lines only mislead.
logging.getLogger("verl.plugin.platform.platform_manager").addFilter(
    _DropMessages("CPU-only actor", "No supported accelerator detected"))


def run(cfg: DictConfig | dict[str, Any]) -> int:
    """Run one training run from a composed config; returns the process exit code."""
    from dataflex_rl.local.config import parse_train_config

    resolved = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    resolved.pop("hydra", None)
    try:
        config = parse_train_config(resolved)
    except ConfigError as error:
        return _refuse(f"bad config: {error}")
    if config.mode == "sft":
        return _run_validated(config, resolved)
    from dataflex_rl.tracking.run_store import RunLock, RunLockedError

    lock = RunLock(config.run_dir)
    try:
        lock.acquire()
    except RunLockedError as error:
        return _refuse(str(error))
    try:
        return _run_validated(config, resolved)
    finally:
        lock.release()


def _refuse(message: str) -> int:
    log.error("%s", message)
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check_run_dir(run_dir: Path, resolved: dict[str, Any], total_steps: int) -> int | None:
    """An exit code when the run must not (or need not) go on; None to train. Holds the run's lock."""
    from dataflex_rl.tracking.run_store import (
        ConfigMismatchError,
        RunStoreError,
        check_resume,
        read_config,
        read_status,
        remove_stale_temporaries,
    )

    try:
        check_resume(run_dir, resolved)
        status = read_status(run_dir) or {}
        recorded_steps = ((read_config(run_dir) or {}).get("trainer") or {}).get("total_steps")
    except ConfigMismatchError as error:
        return _refuse(str(error))
    except RunStoreError as error:
        log.warning("%s; the run resumes from its last checkpoint", error)
        status, recorded_steps = {}, None
    remove_stale_temporaries(run_dir)
    if status.get("state") == "completed":
        if recorded_steps is not None and total_steps > recorded_steps:
            log.info("extending completed run %s from %d to %d steps", run_dir, recorded_steps, total_steps)
            return None
        print(f"run {run_dir} is already completed; nothing to do (delete the folder to run it again)")
        return 0
    return None


def _run_validated(config, resolved: dict[str, Any]) -> int:
    import torch

    from dataflex_rl.local.sft import warm_start
    from dataflex_rl.tasks import build_task

    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if config.threads:
        torch.set_num_threads(config.threads)
    # parse_train_config built the task while validating it; build it here only for a hand-made config
    task = config.task.built or build_task(config.task.name, config.task.params)
    if config.mode == "sft":
        _, _, directory = warm_start(config.model, config.task, config.sft, task)
        print(f"SFT warm start ready: {directory}")
        return 0

    run_dir = Path(config.run_dir)
    code = _check_run_dir(run_dir, resolved, config.trainer.total_steps)
    if code is not None:
        return code
    from dataflex_rl.interrupts import raise_on_sigterm
    from dataflex_rl.tracking import RunStore

    store = RunStore(run_dir)
    raise_on_sigterm()
    try:
        return _train(config, resolved, task, store)
    except KeyboardInterrupt:
        log.warning("interrupted; the run store and the last checkpoint are kept (same command resumes)")
        _record_outside_loggers(store, "interrupted")
        return 130
    except Exception:
        log.exception("run failed; status.json holds the traceback")
        _record_outside_loggers(store, "failed")
        return 1


def _record_outside_loggers(store, state: str) -> None:
    """A failure before the loggers took over (warm start, W&B start): recorded too, from memory only."""
    if store.closed:  # the loggers closed it: the status already says what happened
        return
    from dataflex_rl.tracking.base import describe_error

    error = sys.exc_info()[1]
    store.record_error(state, error=describe_error(error), traceback=traceback.format_exc())


def _train(config, resolved: dict[str, Any], task, store) -> int:
    from dataflex_rl import build_mechanism
    from dataflex_rl.local.model import count_parameters
    from dataflex_rl.local.sft import warm_start
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tracking import RunIdentity, build_loggers

    run_dir = store.run_dir
    mechanism = build_mechanism(config.dataflex)
    identity = RunIdentity.for_config(
        resolved,
        sweep=config.sweep or "single",
        run=config.run_name or run_dir.name,
        backend="local",
        mechanism=config.dataflex.mechanism,
        alpha=float(config.alpha if config.alpha is not None else 0.0),
        seed=config.seed,
        axis_keys=config.axes,
    )
    start = time.perf_counter()
    model, tokenizer, sft_dir = warm_start(config.model, config.task, config.sft, task)
    loggers = build_loggers(config.logger, store, identity, resolved)
    with loggers:
        trainer = GRPOTrainer(config, task, model, tokenizer, mechanism, loggers, run_dir / "checkpoints")
        start_step = trainer.load_checkpoint()
        store.write_meta(identity, extra={
            "mechanism_label": config.mechanism_label,
            "task": config.task.name,
            "parameters": count_parameters(model),
            "sft_checkpoint": str(sft_dir) if sft_dir else None,
            "resumed_from_step": start_step,
        })
        store.set_status("running", step=start_step)
        if start_step:
            store.truncate_after(start_step)
            log.info("resuming %s from step %d", run_dir, start_step)
        elif store.clear_logs():
            log.info("starting %s afresh: lines of an attempt that left no checkpoint were dropped", run_dir)
        loggers.log_config(resolved)
        final = trainer.fit(start_step)
        store.set_status("running", step=config.trainer.total_steps)
    accuracy = final.get("val/accuracy")
    print(f"run completed in {time.perf_counter() - start:.1f} s: {run_dir}"
          + (f" (val/accuracy {accuracy:.3f})" if accuracy is not None else ""))
    return 0


def precheck(overrides: list[str]) -> str | None:
    """What Hydra would refuse, and what the run would refuse, before Hydra creates ``run_dir`` and its
    ``train.log``: an override that does not compose (a key typo, an unknown task), a bad value, a config that
    differs from the recorded one, a run being written by another process. Returns the refusal, or None."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dataflex_rl.local.config import parse_train_config
    from dataflex_rl.tracking.run_store import ConfigMismatchError, RunLock, RunLockedError, check_resume

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            try:
                composed = compose(config_name="train", overrides=overrides)
            except (HydraException, OmegaConfBaseException) as error:
                unknown = unknown_override_message(
                    error, overrides, lambda others: compose(config_name="train", overrides=others))
                if unknown:
                    return f"bad override: {unknown}"
                raise
        resolved = OmegaConf.to_container(composed, resolve=True)
        config = parse_train_config(resolved)
    except (HydraException, OmegaConfBaseException) as error:
        return f"bad override: {error}"
    except ConfigError as error:
        return f"bad config: {error}"
    run_dir = Path(config.run_dir)
    if config.mode == "sft" or not run_dir.is_dir():
        return None
    try:
        check_resume(run_dir, resolved)
        RunLock(run_dir).acquire().release()  # only a probe: the run takes the lock for its life in run()
    except (ConfigMismatchError, RunLockedError) as error:
        return str(error)
    except ValueError as error:  # a damaged store: the run itself reports it
        log.debug("precheck skipped: %s", error)
    return None


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """Hydra's entry: run the composed config and exit with the run's own code (Hydra discards return values)."""
    code = run(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    """``python -m dataflex_rl.train``: refusals exit 2 before Hydra touches ``run_dir``; then Hydra runs it.

    Hydra's own flags (``--help``, ``--cfg``, ``-m``, ...) go straight to Hydra.
    """
    arguments = sys.argv[1:]
    if not any(argument.startswith("-") for argument in arguments):
        refusal = precheck(arguments)
        if refusal is not None:
            print(f"error: {refusal}", file=sys.stderr)
            sys.exit(2)
    hydra_main()
