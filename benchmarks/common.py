"""What every benchmark shares: interleaved timing rounds (every side warmed up, the sides taking turns in each
round so that machine noise hits them alike, min and median over the rounds), the one table ``make bench`` prints,
and the default run's trainer, built as ``python -m dataflex_rl.local.train`` builds it."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: ``before`` and ``after`` as (min, median) in ``unit``."""

    benchmark: str
    measure: str
    unit: str
    before: tuple[float, float] | None
    after: tuple[float, float]
    ratio: float | None = None
    note: str = ""


def min_median(samples: Sequence[float], scale: float = 1.0) -> tuple[float, float]:
    return min(samples) * scale, statistics.median(samples) * scale


def interleaved(sides: Mapping[str, Callable[[], Any]], rounds: int, warmup: int = 1,
                timed: bool = True) -> dict[str, list[Any]]:
    """Each side's seconds per call (``timed=False``: what it returns) over ``rounds``, after ``warmup`` calls of
    each; the sides take turns, in reverse order every other round."""
    names = list(sides)
    for _ in range(warmup):
        for name in names:
            sides[name]()
    results: dict[str, list[Any]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            value = sides[name]()
            results[name].append(time.perf_counter() - start if timed else value)
    return results


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def format_table(rows: Sequence[Row]) -> str:
    """The markdown table: benchmark, what is measured, before and after as min / median, ratio, notes."""
    lines = [["benchmark", "measure", "before (min / median)", "after (min / median)", "ratio", "note"]]
    lines.append(["---"] * len(lines[0]))
    for row in rows:
        ratio = row.ratio
        if ratio is None and row.before is not None and row.before[1]:
            ratio = row.after[1] / row.before[1]
        cells = ["-" if value is None else f"{_number(value[0])} / {_number(value[1])} {row.unit}"
                 for value in (row.before, row.after)]
        lines.append([row.benchmark, row.measure, *cells, "-" if ratio is None else f"{ratio:.2f}x", row.note])
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def options(doc: str | None, argv: Sequence[str] | None, **defaults: Any) -> argparse.Namespace:
    """A module's command line, ``--name`` per keyword: its type is its default's (False: a flag, a list: repeatable,
    None: a path); a ``(default, help)`` pair adds a help text."""
    parser = argparse.ArgumentParser(description=doc)
    for name, value in defaults.items():
        default, text = value if isinstance(value, tuple) else (value, None)
        flag, kind = f"--{name.replace('_', '-')}", {bool: "store_true", list: "append"}.get(type(default))
        if kind:
            parser.add_argument(flag, action=kind, default=default, help=text)
        else:
            parser.add_argument(flag, type=Path if default is None else type(default), default=default, help=text)
    return parser.parse_args(argv)


def printed(rows: list[Row]) -> list[Row]:
    """``rows``, printed as a table (what each module prints when run on its own)."""
    print(format_table(rows), flush=True)
    return rows


def build_trainer(run_dir: Path, overrides: Sequence[str]) -> tuple[Any, Any]:
    """The default run's trainer and its loggers (entered by the caller), with Hydra ``overrides``."""
    from dataflex_rl import build_mechanism
    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tasks import build_task
    from dataflex_rl.tinylm.sft import warm_start
    from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers

    resolved = compose_train_config([f"run_dir={run_dir}", *overrides])
    config = parse_train_config(resolved)
    task = build_task(config.task.name, config.task.params)
    model, tokenizer, _ = warm_start(config.model, config.task, config.sft, task)
    identity = RunIdentity.for_config(resolved, sweep="bench", run="bench", backend="local", mechanism="reweight",
                                      alpha=float(config.dataflex.alpha or 0.0), seed=config.seed)
    loggers = build_loggers(config.logger, RunStore(run_dir), identity, resolved)
    trainer = GRPOTrainer(config, task, model, tokenizer, build_mechanism(config.dataflex), loggers,
                          run_dir / "checkpoints")
    return trainer, loggers
