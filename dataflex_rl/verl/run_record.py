"""The run store of a verl run, beside verl's own loggers: the same files as the local backend writes.

The trainer writes ``config.yaml`` (verl's resolved config), ``meta.json`` (the run's identity: sweep, run,
backend ``verl``, mechanism, alpha, seed, config hash, git commit; plus ``mechanism_label``), ``status.json``
(running, completed, failed with the traceback, interrupted), ``metrics.jsonl`` (every numeric metric verl logs for
a step, at verl's global step) then ``metrics.parquet``, and the mechanism's histograms, through
:class:`dataflex_rl.tracking.RunStore`. So ``python -m analysis.report runs/<sweep>`` reads a ``BACKEND=verl``
sweep like a local one.

Where and under what name, from an optional ``dataflex_run`` block of the verl config (the sweep driver passes it;
without ``dataflex_run.dir`` no run store is written)::

    +dataflex_run.dir=runs/<sweep>/<run>  +dataflex_run.sweep=<sweep>  +dataflex_run.name=<run>
    +dataflex_run.mechanism_label=<preset>  +dataflex_run.seed=<seed>  +dataflex_run.axes=[<swept config keys>]

``sweep`` defaults to ``trainer.project_name``, ``name`` to the folder's name, ``seed`` to ``data.seed``,
``mechanism_label`` to the mechanism; ``axes`` (the grid's axes, recorded with their values in ``meta.json``) to none.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import traceback as traceback_module
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dataflex_rl import keys
from dataflex_rl.validation import ConfigError, check_keys, to_plain
from dataflex_rl.metrics import Histogram
from dataflex_rl.tracking import RunIdentity, RunStore

BACKEND = "verl"
RUN_BLOCK = "dataflex_run"
RUN_KEYS = ("dir", "sweep", "name", "mechanism_label", "seed", "axes")
# verl's validation accuracy of one data source (the K&K reward returns an accuracy, verl averages it).
VAL_ACC_PREFIX, VAL_ACC_SUFFIX = "val-core/", "/acc/mean@1"


@dataclasses.dataclass(frozen=True)
class RunPlace:
    """The ``dataflex_run`` block, validated and with its defaults filled in."""

    dir: Path
    sweep: str
    name: str
    mechanism_label: str
    seed: int
    axes: tuple[str, ...] = ()


def run_place(config: Mapping[str, Any], mechanism: str) -> RunPlace | None:
    """The run store's place from a verl config (``None``: the config has no ``dataflex_run.dir``)."""
    block = config.get(RUN_BLOCK)
    if block is None:
        return None
    block = to_plain(block)
    if not isinstance(block, Mapping):
        raise ConfigError(f"{RUN_BLOCK} = {block!r} is not allowed: it must be a mapping with keys {RUN_KEYS}")
    check_keys(RUN_BLOCK, block, RUN_KEYS)
    if not block.get("dir"):
        return None
    seed = block.get("seed", to_plain(config.get("data", {})).get("seed", 0))
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"{RUN_BLOCK}.seed = {seed!r} is not allowed: it must be an integer")
    directory = Path(str(block["dir"]))
    return RunPlace(
        dir=directory,
        sweep=str(block.get("sweep") or to_plain(config.get("trainer", {})).get("project_name") or "verl"),
        name=str(block.get("name") or directory.name),
        mechanism_label=str(block.get("mechanism_label") or mechanism),
        seed=int(seed),
        axes=tuple(str(key) for key in block.get("axes") or ()),
    )


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a verl metric dict (Python, numpy or 0-d tensor scalars); the rest is skipped.

    Adds ``val/accuracy`` when verl logged the validation accuracy of exactly one data source
    (``val-core/<source>/acc/mean@1``), so the analysis's default metric is there for verl runs too.
    """
    numbers_only: dict[str, float] = {}
    for key, value in metrics.items():
        number = scalar(value)
        if isinstance(key, str) and key != "step" and number is not None:
            numbers_only[key] = number
    accuracies = [key for key in numbers_only if key.startswith(VAL_ACC_PREFIX) and key.endswith(VAL_ACC_SUFFIX)]
    if len(accuracies) == 1 and keys.VAL_ACCURACY not in numbers_only:
        numbers_only[keys.VAL_ACCURACY] = numbers_only[accuracies[0]]
    return numbers_only


def scalar(value: Any) -> float | None:
    """A finite float from a Python, numpy or one-element tensor number; ``None`` for anything else."""
    if isinstance(value, bool):
        return None
    item = getattr(value, "item", None)
    if item is not None and not isinstance(value, numbers.Real):
        try:
            value = item()
        except (ValueError, RuntimeError):  # more than one element
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        return None
    return float(value)


class VerlRunRecord:
    """One verl run's :class:`RunStore`: opened at the start of ``fit``, one line per step, closed at its end."""

    def __init__(self, place: RunPlace, resolved_config: Mapping[str, Any], mechanism: str, alpha: float) -> None:
        self.place = place
        self.store = RunStore(place.dir)
        self.config = {**to_plain(resolved_config), "mechanism_label": place.mechanism_label}
        self.identity = RunIdentity.for_config(
            self.config, sweep=place.sweep, run=place.name, backend=BACKEND, mechanism=mechanism, alpha=alpha,
            seed=place.seed, axis_keys=place.axes,
        )
        if "seed" in self.identity.axes:  # verl's seeds live in several places; the run's seed is the block's
            self.identity = dataclasses.replace(self.identity, axes={**self.identity.axes, "seed": place.seed})

    def start(self, global_step: int) -> None:
        """Meta, config and status ``running``; on a resume at ``global_step`` > 0 the lines after it are dropped
        (verl restarts from its checkpoint), on a fresh start every earlier line is."""
        self.store.write_meta(self.identity, extra={
            "mechanism_label": self.place.mechanism_label, "resumed_from_step": global_step,
        })
        self.store.set_status("running", step=global_step)
        if global_step:
            self.store.truncate_after(global_step)
        else:
            self.store.clear_logs()
        self.store.log_config(self.config)

    def log_step(self, step: int, metrics: Mapping[str, Any], histograms: Mapping[str, Histogram]) -> None:
        """Record one step's numeric metrics and the mechanism's histograms."""
        self.store.log_metrics(step, numeric_metrics(metrics))
        for name, histogram in histograms.items():
            self.store.log_histogram(step, name, histogram.edges.tolist(), histogram.counts.tolist())

    def finish(self, error: BaseException | None = None) -> None:
        """Close the store: ``completed``, or ``failed``/``interrupted`` with the error and its traceback."""
        if error is None:
            self.store.close("completed")
            return
        state = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        formatted = "".join(traceback_module.format_exception(type(error), error, error.__traceback__))
        self.store.record_error(state, error=f"{type(error).__name__}: {error}", traceback=formatted)
        self.store.close(state)
