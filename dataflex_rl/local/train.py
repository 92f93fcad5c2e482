"""``python -m dataflex_rl.local.train [overrides]``: one run on the local CPU backend (docs/run_store.md).
``--config-file PATH`` runs a resolved config the sweep driver wrote; ``--cfg`` prints the composed config;
``--help`` prints this text."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from dataflex_rl.compose import compose_train_config
from dataflex_rl.run_config import CONFIG_FILE_FLAG, read_config_file
from dataflex_rl.validation import ConfigError

log = logging.getLogger("dataflex_rl.local.train")  # not __name__: run as __main__, train.log keeps this name
# verl probes optional engines (megatron, mindspeed, ...) at import and warns for each one missing on a CPU box.
warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
# The console and train.log in the format of Hydra's job logging (hydra/job_logging/default.yaml).
LOG_FILE = "train.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
# verl's platform probe blames "a CPU-only ray actor": on the local backend the CPU is intended and there is no Ray.
logging.getLogger("verl.plugin.platform.platform_manager").addFilter(lambda record: not any(
    fragment in record.getMessage() for fragment in ("CPU-only actor", "No supported accelerator detected")))


def run(resolved: Mapping[str, Any]) -> int:
    """One run of a composed config in this process, the caller's logging left as is; returns the exit code."""
    resolved = dict(resolved)
    try:
        config, lock = _admit(resolved)
    except ConfigError as error:
        return _refuse(str(error))
    return _run_admitted(config, resolved, lock)


def _admit(resolved: dict[str, Any]) -> tuple[Any, Any]:
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tracking.run_store import RunLock, RunStoreError, check_resume

    try:
        config = parse_train_config(resolved)
    except ConfigError as error:
        raise ConfigError(f"bad config: {error}") from None
    if config.mode == "sft":
        return config, None
    run_dir = Path(config.run_dir)
    _check_not_a_sweep(run_dir)
    if run_dir.is_dir():
        try:
            check_resume(run_dir, resolved)
        except RunStoreError as error:  # a damaged store: the run itself reports it (_check_run_dir)
            log.debug("resume check left to the run: %s", error)
    return config, RunLock(run_dir).acquire()


def _check_not_a_sweep(run_dir: Path) -> None:
    from dataflex_rl.tracking.run_store import RunStoreError, is_sweep_folder, read_sweep_record

    if not is_sweep_folder(run_dir):
        return
    try:
        runs = len((read_sweep_record(run_dir) or {}).get("runs") or [])
    except RunStoreError:
        runs = 0
    raise ConfigError(
        f"run_dir = {str(run_dir)!r} is not allowed: it is a sweep folder (it holds sweep.json, python -m "
        f"sweeps' record of {runs} run(s)), not a run folder; give the run a folder of its own, e.g. "
        f"run_dir={run_dir.parent / (run_dir.name + '-run')}, or resume the sweep's runs with make sweep "
        f"SWEEP={run_dir.name}")


def _run_admitted(config, resolved: dict[str, Any], lock) -> int:
    try:
        return _run_validated(config, resolved)
    finally:
        if lock is not None:
            lock.release()


def _refuse(message: str) -> int:
    log.error("%s", message)
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check_run_dir(run_dir: Path, resolved: dict[str, Any], total_steps: int) -> int | None:
    from dataflex_rl.tracking.run_store import (COMPLETED,
                                                ConfigMismatchError, RunStoreError, check_resume, read_config,
                                                read_status, remove_stale_temporaries)

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
    if status.get("state") == COMPLETED:
        if recorded_steps is not None and total_steps > recorded_steps:
            log.info("extending completed run %s from %d to %d steps", run_dir, recorded_steps, total_steps)
            return None
        print(f"run {run_dir} is already completed; nothing to do (delete the folder to run it again)")
        return 0
    return None


def _run_validated(config, resolved: dict[str, Any]) -> int:
    import torch

    from dataflex_rl.tinylm.sft import warm_start
    from dataflex_rl.tasks import build_task

    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if config.threads:
        torch.set_num_threads(config.threads)
    # parse_train_config built the task while validating it; build it here only for a hand-made config
    task = config.task.built or build_task(config.task.name, config.task.params)
    if config.mode == "sft":
        from dataflex_rl.tinylm.sft import SFTCacheError

        try:
            _, _, directory = warm_start(config.model, config.task, config.sft, task)
        except SFTCacheError as error:
            return _refuse(str(error))
        print(f"SFT warm start ready: {directory}")
        return 0

    run_dir = Path(config.run_dir)
    code = _check_run_dir(run_dir, resolved, config.trainer.total_steps)
    if code is not None:
        return code
    from dataflex_rl.interrupts import raise_on_sigterm
    from dataflex_rl.tracking import RunStore
    from dataflex_rl.tracking.run_store import FAILED, INTERRUPTED

    store = RunStore(run_dir)
    raise_on_sigterm()
    try:
        return _train(config, resolved, task, store)
    except KeyboardInterrupt:
        log.warning("interrupted; the run store and the last checkpoint are kept (same command resumes)")
        _record_outside_loggers(store, INTERRUPTED)
        return 130
    except Exception:
        log.exception("run failed; status.json holds the traceback")
        _record_outside_loggers(store, FAILED)
        return 1


def _record_outside_loggers(store, state: str) -> None:
    if store.closed:  # the loggers closed it: the status already says what happened
        return
    from dataflex_rl.tracking.base import describe_error

    store.record_error(state, error=describe_error(sys.exc_info()[1]), traceback=traceback.format_exc())


def _train(config, resolved: dict[str, Any], task, store) -> int:
    from dataflex_rl import build_mechanism
    from dataflex_rl.tinylm.model import count_parameters
    from dataflex_rl.tinylm.sft import warm_start, warm_start_outcome
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tracking import RunIdentity, build_loggers
    from dataflex_rl.tracking.identity import warm_start_record
    from dataflex_rl.tracking.run_store import RUNNING

    run_dir = store.run_dir
    mechanism = build_mechanism(config.dataflex)
    identity = RunIdentity.for_config(resolved,
                                      sweep=config.sweep or "single", run=config.run_name or run_dir.name,
                                      backend="local", mechanism=config.dataflex.mechanism,
                                      alpha=float(config.dataflex.alpha or 0.0), seed=config.seed,
                                      axis_keys=config.axes)
    start = time.perf_counter()
    model, tokenizer, sft_dir = warm_start(config.model, config.task, config.sft, task)
    loggers = build_loggers(config.logger, store, identity, resolved)
    with loggers:
        trainer = GRPOTrainer(config, task, model, tokenizer, mechanism, loggers, run_dir / "checkpoints")
        start_step = trainer.load_checkpoint()
        store.write_meta(identity, extra={
            "mechanism_label": config.mechanism_label, "task": config.task.name, "parameters": count_parameters(model),
            "sft_checkpoint": str(sft_dir) if sft_dir else None,
            "warm_start": warm_start_record(config.warm_start, str(sft_dir) if sft_dir else None,
                                            config.sft.seed, warm_start_outcome(sft_dir)),
            "resumed_from_step": start_step,
        })
        store.set_status(RUNNING, step=start_step)
        if start_step:
            store.truncate_after(start_step)
            log.info("resuming %s from step %d", run_dir, start_step)
        elif store.clear_logs():
            log.info("starting %s afresh: lines of an attempt that left no checkpoint were dropped", run_dir)
        loggers.log_config(resolved)
        final = trainer.fit(start_step)
        store.set_status(RUNNING, step=config.trainer.total_steps)
    accuracy = final.get("val/accuracy")
    print(f"run completed in {time.perf_counter() - start:.1f} s: {run_dir}"
          + (f" (val/accuracy {accuracy:.3f})" if accuracy is not None else ""))
    return 0


@contextlib.contextmanager
def job_logging(run_dir: Path) -> Iterator[None]:
    """For the block: INFO and above to the console (stdout) and appended to ``<run_dir>/train.log``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout),
                                       logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")]
    root = logging.getLogger()
    level, replaced = root.level, root.handlers[:]  # as Hydra's dictConfig: these handlers only, not an imported
    for handler in replaced:                         # library's basicConfig one (every line would print twice)
        root.removeHandler(handler)
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        for handler in replaced:
            root.addHandler(handler)


def main() -> None:
    arguments = sys.argv[1:]
    try:
        if arguments[:1] == [CONFIG_FILE_FLAG]:
            if len(arguments) != 2:
                raise ConfigError(f"{CONFIG_FILE_FLAG} takes one path and nothing else (the file is the whole "
                                  f"config): python -m dataflex_rl.local.train {CONFIG_FILE_FLAG} PATH")
            resolved = read_config_file(arguments[1])
        elif arguments[:1] in (["--help"], ["-h"]):
            print(__doc__)
            return
        elif arguments[:1] == ["--cfg"]:
            overrides = arguments[2:] if arguments[1:2] == ["job"] else arguments[1:]
            print(yaml.safe_dump(compose_train_config(overrides), sort_keys=False), end="")
            return
        else:
            flags = [argument for argument in arguments if argument.startswith("-")]
            if flags:
                raise ConfigError(f"{flags[0]} is not allowed: give overrides key=value, {CONFIG_FILE_FLAG} PATH, "
                                  f"--cfg or --help")
            resolved = compose_train_config(arguments)
        config, lock = _admit(resolved)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    with job_logging(Path(config.run_dir)):
        code = _run_admitted(config, resolved, lock)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
