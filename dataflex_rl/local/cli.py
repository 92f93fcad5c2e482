"""The local CPU backend's command line, behind ``python -m dataflex_rl.train`` (the public command, a thin module).

A run's config reaches the trainer composed once and validated once, by one of two ways:

* ``python -m dataflex_rl.train [hydra overrides]``: ``conf/train.yaml`` composed here with Hydra's compose API;
* ``python -m dataflex_rl.train --config-file PATH``: a resolved config the sweep driver composed and validated
  (:func:`write_config_file`); nothing is composed.

Then: parse it (:func:`~dataflex_rl.local.config.parse_train_config`, the one validation), refuse what must touch
nothing (a bad value, a config that differs from the recorded run, another writer), take the run's lock, log to the
console and ``<run_dir>/train.log`` (:func:`job_logging`), check a resume, warm start and train
(:class:`dataflex_rl.local.trainer.GRPOTrainer`). Hydra's own flags (``--help``, ``--cfg job``, ``-m``, ...) go to
Hydra's entry point (:func:`hydra_main`).

Overrides, exit codes and the resume rules: :mod:`dataflex_rl.train`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import hydra
import yaml
from omegaconf import DictConfig, OmegaConf

from dataflex_rl.overrides import Override, override_key, parse_override, unknown_override_message
from dataflex_rl.validation import ConfigError

log = logging.getLogger("dataflex_rl.train")  # the public command's name, as train.log has always shown it
# verl probes optional engines (megatron, mindspeed, ...) at import and warns for each one missing on a CPU box.
warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
# ``python -m dataflex_rl.train --config-file PATH``: a resolved config (the sweep driver's), not composed again.
CONFIG_FILE_FLAG = "--config-file"
# The console and train.log as Hydra's job logging wrote them (hydra/job_logging/default.yaml; the log is named after
# the job, ``hydra.job.name: train`` in conf/train.yaml).
LOG_FILE = "train.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


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
    """One training run from a composed config, in this process (tests, benchmarks); returns the exit code.

    The caller's logging stays as it is (the command line adds the console and ``train.log``: :func:`main`)."""
    resolved = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    resolved.pop("hydra", None)
    try:
        config, lock = _admit(resolved)
    except ConfigError as error:
        return _refuse(str(error))
    return _run_admitted(config, resolved, lock)


def _admit(resolved: dict[str, Any]) -> tuple[Any, Any]:
    """``(TrainConfig, the run's lock held)`` (no lock for ``mode=sft``): the one validation of a run's config,
    then the refusals that touch nothing. Raises :class:`ConfigError`: a bad value, a ``run_dir`` that is a sweep
    folder, a config that differs from the one recorded in ``run_dir`` (checked before the lock, so a refused resume
    leaves every file as it was), a run being written by another process."""
    from dataflex_rl.local.config import parse_train_config
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
    """Refuse a ``run_dir`` that is a sweep folder (it holds ``sweep.json``): the run would write its store into the
    sweep's folder, over the sweep's own tables. Raises :class:`ConfigError` naming what is there and what to use."""
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
    """Train an admitted run (:func:`_admit`), then give its lock up."""
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
    from dataflex_rl.tracking.identity import warm_start_record

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
            "warm_start": warm_start_record(config.warm_start, str(sft_dir) if sft_dir else None,
                                            config.sft.seed),
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


# --- the command line ----------------------------------------------------------------------------------------
# The config group of named experiments: conf/experiment/<name>.yaml, each ``@package _global_`` (it may set any key).
EXPERIMENT_GROUP = "experiment"


def group_choices(group: str) -> list[str] | None:
    """The choices of the config group ``group`` (the names of ``conf/<group>/*.yaml``), or None when ``group`` is
    not a config group."""
    if not group or not group.isidentifier():  # a dotted key, a path, a package: not a group of conf/
        return None
    folder = Path(CONF_DIR) / group
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder.is_dir() else None


def run_experiments() -> list[str]:
    """Names of the named experiments a run can be composed with: ``conf/experiment/<name>.yaml``."""
    return group_choices(EXPERIMENT_GROUP) or []


def check_group_choice(override: Override, allowed: Sequence[str] | None = None) -> None:
    """Refuse a config-group override (``task=``, ``dataflex=``, ``model=``, ``trainer=``, ``logger=``,
    ``experiment=``; each value of a sweep over it) whose choice is not one of the group's names (``allowed``, by
    default :func:`group_choices`): Hydra reads a choice as a path, so ``experiment=../launcher/slurm`` or
    ``task=../experiment/kk`` would load another group's file, which may set any key. :class:`ConfigError` naming
    the key, the value and the names allowed."""
    group = override.key
    allowed = group_choices(group) if allowed is None else allowed
    if allowed is None:
        return
    article = "an" if group[:1] in "aeiou" else "a"
    choices = override.sweep if override.sweep is not None else (override.value,)
    for choice in choices:
        if choice is not None and choice != "null" and choice not in allowed:
            raise ConfigError(f"{group} = {choice!r} is not allowed: {article} {group} is the name of a file "
                              f"conf/{group}/<name>.yaml (a name, not a path); allowed: "
                              f"{', '.join(allowed) or '(none)'}")


def compose_train_config(overrides: Sequence[str]) -> dict[str, Any]:
    """``conf/train.yaml`` composed with ``overrides`` (Hydra's compose API) and resolved, ``hydra`` block dropped.

    Raises :class:`ConfigError` (``bad override: ...``) for an override that does not compose: a key typo (named
    with the allowed keys), an unknown task, a value that does not resolve."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    for text in overrides:
        if group_choices(override_key(text)) is not None:
            check_group_choice(parse_override(text))
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            try:
                composed = compose(config_name="train", overrides=overrides)
            except (HydraException, OmegaConfBaseException) as error:
                unknown = unknown_override_message(
                    error, overrides, lambda others: compose(config_name="train", overrides=others))
                if unknown:
                    raise ConfigError(f"bad override: {unknown}") from None
                raise
        resolved = OmegaConf.to_container(composed, resolve=True)
    except (HydraException, OmegaConfBaseException) as error:
        raise ConfigError(f"bad override: {error}") from None
    resolved.pop("hydra", None)
    return resolved


def write_config_file(path: Path, resolved: Mapping[str, Any], comment: Sequence[str] = ()) -> None:
    """Write a resolved config for ``--config-file``: ``comment`` lines first (``# ...``), then the config as the
    run store writes ``config.yaml`` (YAML, keys in their given order); atomically (the run store's writer)."""
    from dataflex_rl.tracking.run_store import atomic_write_bytes
    from dataflex_rl.validation import to_plain

    header = "".join("# " + line.replace("\r", "\\r").replace("\n", "\\n") + "\n" for line in comment)
    text = yaml.safe_dump(to_plain(resolved), sort_keys=False, default_flow_style=False, allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (header + text).encode("utf-8"))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The resolved config in ``path`` (written by :func:`write_config_file`); :class:`ConfigError` naming the
    file when it cannot be read or holds no mapping."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read: {error.strerror or error}") from None
    try:
        config = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - a safe loader
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config file {path} holds a {type(config).__name__}, expected a resolved conf/train.yaml")
    return config


@contextlib.contextmanager
def job_logging(run_dir: Path) -> Iterator[None]:
    """For the block: INFO and above to the console (stdout) and appended to ``<run_dir>/train.log``, in the format
    of Hydra's job logging (``hydra/job_logging/default.yaml``), which the command used before it composed its
    config itself."""
    run_dir.mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout),
                                       logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")]
    root = logging.getLogger()
    level, replaced = root.level, root.handlers[:]  # as Hydra's dictConfig: these handlers only, not an imported
    for handler in replaced:                         # library's basicConfig one (every line would print twice)
        root.removeHandler(handler)
    for handler in handlers:
        handler.setFormatter(formatter)
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


def run_command(resolved: dict[str, Any]) -> int:
    """The command line's run of a resolved config: validated once, refused (exit 2, a message on stderr) before
    anything is written to ``run_dir``, then trained with :func:`job_logging`; returns the exit code."""
    try:
        config, lock = _admit(resolved)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with job_logging(Path(config.run_dir)):
        return _run_admitted(config, resolved, lock)


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """Hydra's entry, for Hydra's own flags: run the composed config and exit with the run's own code (Hydra
    discards return values)."""
    code = run(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    """``python -m dataflex_rl.train``: ``--config-file PATH`` reads a resolved config (nothing is composed);
    overrides are composed once; either is then validated once and run (:func:`run_command`). Exits with the run's
    code. Hydra's own flags (``--help``, ``--cfg``, ``-m``, ...) go to Hydra's entry point."""
    arguments = sys.argv[1:]
    try:
        if arguments[:1] == [CONFIG_FILE_FLAG]:
            if len(arguments) != 2:
                raise ConfigError(f"{CONFIG_FILE_FLAG} takes one path and nothing else (the file is the whole "
                                  f"config): python -m dataflex_rl.train {CONFIG_FILE_FLAG} PATH")
            resolved = read_config_file(arguments[1])
        elif any(argument.startswith("-") for argument in arguments):
            hydra_main()
            return
        else:
            resolved = compose_train_config(arguments)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    code = run_command(resolved)
    if code:
        sys.exit(code)
