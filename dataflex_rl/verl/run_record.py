"""The run store of a verl run, placed by the optional ``dataflex_run`` block (docs/verl.md)."""

import dataclasses
import math
import numbers
import traceback as traceback_module
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dataflex_rl import keys
from dataflex_rl.dataflex_block import DataflexConfig
from dataflex_rl.keys import WARM_START_DESIGNS
from dataflex_rl.validation import ConfigError, check_choice, check_keys, to_plain
from dataflex_rl.metrics import Histogram
from dataflex_rl.tracking import RunIdentity, RunStore, config_hash
from dataflex_rl.tracking.run_store import COMPLETED, FAILED, INTERRUPTED, RUNNING
from dataflex_rl.tracking.identity import warm_start_record

BACKEND = "verl"
RUN_BLOCK = "dataflex_run"
RUN_KEYS = ("dir", "sweep", "name", "mechanism_label", "seed", "axes", "warm_start")
# verl's validation accuracy of one data source (the K&K reward returns an accuracy, verl averages it).
VAL_ACC_PREFIX, VAL_ACC_SUFFIX = "val-core/", "/acc/mean@1"
# The environment variables through which verl's wandb.init takes a run's group, job type and tags.
WANDB_GROUP_VARIABLE, WANDB_JOB_TYPE_VARIABLE, WANDB_TAGS_VARIABLE = "WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_TAGS"


@dataclasses.dataclass(frozen=True)
class RunPlace:
    dir: Path
    sweep: str
    name: str
    mechanism_label: str
    seed: int
    axes: tuple[str, ...] = ()
    warm_start: str | None = None  # the sweep's warm-start design (per_seed | shared)


def run_place(config: Mapping[str, Any], mechanism: str) -> RunPlace | None:
    block = to_plain(config.get(RUN_BLOCK))
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ConfigError(f"{RUN_BLOCK} = {block!r} is not allowed: it must be a mapping with keys {RUN_KEYS}")
    check_keys(RUN_BLOCK, block, RUN_KEYS)
    if not block.get("dir"):
        return None
    seed = block.get("seed", to_plain(config.get("data", {})).get("seed", 0))
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"{RUN_BLOCK}.seed = {seed!r} is not allowed: it must be an integer")
    warm_start = block.get("warm_start")
    directory = Path(str(block["dir"]))
    return RunPlace(
        dir=directory, name=str(block.get("name") or directory.name), seed=int(seed),
        sweep=str(block.get("sweep") or to_plain(config.get("trainer", {})).get("project_name") or "verl"),
        mechanism_label=str(block.get("mechanism_label") or mechanism),
        axes=tuple(str(key) for key in block.get("axes") or ()),
        warm_start=None if warm_start is None else check_choice(f"{RUN_BLOCK}.warm_start", warm_start,
                                                                WARM_START_DESIGNS))


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a verl metric dict, plus ``val/accuracy`` for a single data source."""
    numbers_only = {key: number for key, value in metrics.items()
                    if isinstance(key, str) and key != "step" and (number := scalar(value)) is not None}
    accuracies = [key for key in numbers_only if key.startswith(VAL_ACC_PREFIX) and key.endswith(VAL_ACC_SUFFIX)]
    if len(accuracies) == 1 and keys.VAL_ACCURACY not in numbers_only:
        numbers_only[keys.VAL_ACCURACY] = numbers_only[accuracies[0]]
    return numbers_only


def scalar(value: Any) -> float | None:
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # more than one element
            return None
    finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    return float(value) if finite else None


class VerlRunRecord:
    def __init__(self, place: RunPlace, resolved_config: Mapping[str, Any], dataflex: DataflexConfig) -> None:
        """``dataflex``: the validated block, recorded whole (a user's command line may give only some params)."""
        self.place = place
        self.store = RunStore(place.dir)
        config = {**to_plain(resolved_config), "dataflex": dataflex.to_dict(), "mechanism_label": place.mechanism_label}
        identity = RunIdentity.for_config(
            config, sweep=place.sweep, run=place.name, backend=BACKEND, mechanism=dataflex.mechanism,
            alpha=float(dataflex.alpha or 0.0), seed=place.seed, axis_keys=place.axes,
        )
        if "seed" in identity.axes:  # verl's seeds live in several places; the run's seed is the block's
            identity = dataclasses.replace(identity, axes={**identity.axes, "seed": place.seed})
        config["trainer"] = {**(config.get("trainer") or {}), "experiment_name": identity.wandb_name}
        self.config = config
        self.identity = dataclasses.replace(identity, config_hash=config_hash(config))

    def wandb_environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        tags = [tag for tag in environment.get(WANDB_TAGS_VARIABLE, "").split(",") if tag]
        tags += [tag for tag in self.identity.tags if tag not in tags]
        job_type = {WANDB_JOB_TYPE_VARIABLE: self.identity.job_type} if self.identity.job_type else {}
        return {WANDB_GROUP_VARIABLE: self.identity.sweep, WANDB_TAGS_VARIABLE: ",".join(tags), **job_type}

    def start(self, global_step: int) -> None:
        model_path = ((self.config.get("actor_rollout_ref") or {}).get("model") or {}).get("path")
        self.store.write_meta(self.identity, extra={
            "mechanism_label": self.place.mechanism_label, "resumed_from_step": global_step,
            "warm_start": warm_start_record(self.place.warm_start, None if model_path is None else str(model_path)),
        })
        self.store.set_status(RUNNING, step=global_step)
        if global_step:
            self.store.truncate_after(global_step)
        else:
            self.store.clear_logs()
        self.store.log_config(self.config)

    def log_step(self, step: int, metrics: Mapping[str, Any], histograms: Mapping[str, Histogram]) -> None:
        self.store.log_metrics(step, numeric_metrics(metrics))
        for name, histogram in histograms.items():
            self.store.log_histogram(step, name, histogram.edges.tolist(), histogram.counts.tolist())

    def finish(self, error: BaseException | None = None, traceback: str | None = None) -> None:
        """Close the run: completed, or failed (interrupted) by ``error`` with ``traceback`` (default: the error's)."""
        state = COMPLETED if error is None else INTERRUPTED if isinstance(error, KeyboardInterrupt) else FAILED
        if error is not None:
            formatted = traceback or "".join(traceback_module.format_exception(error))
            self.store.record_error(state, error=f"{type(error).__name__}: {error}", traceback=formatted)
        self.store.close(state)
