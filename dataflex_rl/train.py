"""``python -m dataflex_rl.train [hydra overrides]``: one training run on the local CPU backend.

Public overrides: ``run_dir=PATH``, ``seed=N``, ``trainer.total_steps=N``, ``trainer.val_every=N``, ``sft.steps=N``,
``logger.wandb.mode=offline|online|disabled``, ``task=arithmetic|knights_knaves``, the ``dataflex.*`` block
(``dataflex.actuator.params.alpha=0.25``) and presets (``dataflex=baseline``). The same ``run_dir`` again resumes
from the last checkpoint; a completed run is left as it is. ``mode=sft`` only builds the cached SFT warm start.
Exit codes: 0 completed, 1 failed (``status.json`` has the traceback), 2 bad config (nothing was touched),
130 interrupted.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from dataflex_rl.config import ConfigError

log = logging.getLogger("dataflex_rl.train")
# verl probes optional engines (megatron, mindspeed, ...) at import and warns for each one missing on a CPU box.
warnings.filterwarnings("ignore", message=".*engine is not available", category=UserWarning)
CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


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
        log.error("bad config: %s", error)
        print(f"error: bad config: {error}", file=sys.stderr)
        return 2
    return _run_validated(config, resolved)


def _run_validated(config, resolved: dict[str, Any]) -> int:
    import torch

    from dataflex_rl import build_mechanism
    from dataflex_rl.local.model import count_parameters
    from dataflex_rl.local.sft import warm_start
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tasks import build_task
    from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers

    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if config.threads:
        torch.set_num_threads(config.threads)
    task = build_task(config.task.name, config.task.params)
    if config.mode == "sft":
        _, _, directory = warm_start(config.model, config.task, config.sft, task)
        print(f"SFT warm start ready: {directory}")
        return 0

    run_dir = Path(config.run_dir)
    store = RunStore(run_dir)
    status = store.read_status() or {}
    if status.get("state") == "completed":
        print(f"run {run_dir} is already completed; nothing to do (delete the folder to run it again)")
        return 0

    mechanism = build_mechanism(config.dataflex)
    identity = RunIdentity.for_config(
        resolved,
        sweep=config.sweep or "single",
        run=config.run_name or run_dir.name,
        backend="local",
        mechanism=config.dataflex.mechanism,
        alpha=float(config.alpha if config.alpha is not None else 0.0),
        seed=config.seed,
    )
    _install_sigterm_handler()
    start = time.perf_counter()
    model, tokenizer, sft_dir = warm_start(config.model, config.task, config.sft, task)
    loggers = build_loggers(config.logger, store, identity, resolved)
    try:
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
    except KeyboardInterrupt:
        log.warning("interrupted; the run store and the last checkpoint are kept (same command resumes)")
        return 130
    except Exception:
        log.exception("run failed; status.json holds the traceback")
        return 1
    accuracy = final.get("val/accuracy")
    print(f"run completed in {time.perf_counter() - start:.1f} s: {run_dir}"
          + (f" (val/accuracy {accuracy:.3f})" if accuracy is not None else ""))
    return 0


def _install_sigterm_handler() -> None:
    """SIGTERM (sent by the sweep driver, SLURM, Ray) stops the run like Ctrl-C: marked interrupted."""

    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # Hydra's decorator discards return values; exit with the run's own code.
    code = run(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
