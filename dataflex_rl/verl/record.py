"""``python -m dataflex_rl.verl.record <verl overrides>``: a policy-loss route run of verl's own trainer, writing the
project's run store (docs/verl.md). verl's trainers take no logger plugins, so verl runs as a child process with its
``file`` logger on, and each line it writes (one per step) becomes the run store's step, histograms put back together.
"""

import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl import keys
from dataflex_rl.interrupts import raise_on_sigterm
from dataflex_rl.metrics import Histogram
from dataflex_rl.overrides import hydra_value
from dataflex_rl.run_config import quiet_verl_import
from dataflex_rl.validation import ConfigError, to_plain
from dataflex_rl.verl.config import POLICY_LOSS_KEY, VERL_ENTRY_MODULE, route_of, validate_overrides
from dataflex_rl.verl.run_record import RUN_BLOCK, RunPlace, VerlRunRecord

FILE_LOGGER_VARIABLE = "VERL_FILE_LOGGER_PATH"  # where verl's file logger writes (verl/utils/tracking.py)
FILE_LOG = "verl_file_logger.jsonl"  # in the run's folder
POLL_S = 1.0
TAIL_LINES = 60  # of verl's stderr, kept as the failed run's traceback
STOP_WAIT_S = 60
# verl prefixes what a policy loss returns with "actor/" (rename_dict in its trainers); the run store keeps the
# names the trainer modes log.
ACTOR_PREFIX = "actor/"
ROUTE_PREFIXES = ("dataflex/", f"{keys.GRAD_BY_PROB_PREFIX}/")


class VerlExited(RuntimeError):
    """verl's process ended with a non-zero exit code."""


def route_step(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Histogram]]:
    """One line of verl's file logger as the run store's metrics and histograms."""
    from dataflex_rl.verl.policy_loss import pop_histograms

    metrics = {}
    for key, value in data.items():
        bare = key.removeprefix(ACTOR_PREFIX)
        metrics[bare if bare.startswith(ROUTE_PREFIXES) else key] = value
    return metrics, pop_histograms(metrics)


def resumed_step(config: Any) -> int:
    """The global step verl's trainer resumes from (its ``_load_checkpoint``), 0 for a fresh start."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    trainer = config.trainer
    if trainer.resume_mode == "disable":
        return 0
    folder = (trainer.resume_from_path if trainer.resume_mode == "resume_path"
              else find_latest_ckpt_path(os.path.abspath(trainer.default_local_dir)))
    return int(str(folder).split("global_step_")[-1]) if folder else 0


class FileLog:
    """The complete lines verl's file logger has written since the last call."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new_lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            chunk = stream.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]


def verl_command(overrides: Sequence[str], config: Any, record: VerlRunRecord) -> list[str]:
    """verl's command with its file logger on, the run's W&B name and identity, and the route's histograms."""
    loggers = to_plain(config.trainer.logger)
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    return [sys.executable, "-m", VERL_ENTRY_MODULE, *overrides,
            f"trainer.logger={hydra_value([*loggers, *(['file'] if 'file' not in loggers else [])])}",
            f"trainer.experiment_name={hydra_value(record.identity.wandb_name)}",
            f"+run_identity={hydra_value(record.identity.to_dict())}", f"+{POLICY_LOSS_KEY}.histograms=true"]


def record_run(overrides: Sequence[str], config: Any, dataflex: Any, place: RunPlace) -> int:
    """verl's exit code."""
    record = VerlRunRecord(place, config, dataflex)
    log = FileLog(place.dir / FILE_LOG)
    log.path.unlink(missing_ok=True)  # verl truncates it at start: never read a previous session's lines
    environment = {**os.environ, **record.wandb_environment(os.environ), FILE_LOGGER_VARIABLE: str(log.path)}
    record.start(resumed_step(config))
    process = subprocess.Popen(verl_command(overrides, config, record), env=environment, stdin=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, errors="replace")
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)

    def copy_stderr() -> None:
        for line in process.stderr:
            sys.stderr.write(line)
            tail.append(line)

    copier = threading.Thread(target=copy_stderr, daemon=True)
    copier.start()
    try:
        while True:
            finished = process.poll() is not None
            for line in log.new_lines():
                record.log_step(line["step"], *route_step(line["data"]))
            if finished:
                break
            time.sleep(POLL_S)
        copier.join()
    except BaseException as error:  # SIGTERM (KeyboardInterrupt) or the run store failing: verl stops too
        process.terminate()
        try:
            process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
        record.finish(error)
        raise
    if process.returncode:
        record.finish(VerlExited(f"verl exited with code {process.returncode}"), traceback="".join(tail))
    else:
        record.finish()
    return process.returncode


def main(argv: Sequence[str] | None = None) -> int:
    overrides = list(sys.argv[1:] if argv is None else argv)
    try:
        with quiet_verl_import():
            config, mechanism, place = validate_overrides(overrides, os.environ)
        if route_of(config) != "policy_loss":
            raise ConfigError("the dataflex trainer modes write their run store themselves: run them with "
                              f"python -m {VERL_ENTRY_MODULE}; this recorder serves the policy-loss route")
        if place is None:
            raise ConfigError(f"{RUN_BLOCK}.dir: missing; the recorder writes a run store there (without one, run "
                              f"python -m {VERL_ENTRY_MODULE})")
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    raise_on_sigterm()
    return record_run(overrides, config, mechanism.config, place)


if __name__ == "__main__":
    raise SystemExit(main())
