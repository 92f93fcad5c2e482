"""The numeric environment of runs (CPU kernels, BLAS, threads, CPU): the run table's label, and the report's
Environment section and warning."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

UNKNOWN_ENVIRONMENT = "unknown"
SHOWN_RUN_NAMES = 4
ENVIRONMENT_NOTE = ("Each included run's numeric environment, from its `meta.json`: the CPU kernel set torch "
                    "dispatched to (with `ATEN_CPU_CAPABILITY` when it capped it), the BLAS torch was built with, "
                    "torch's threads and the CPU; runs of different environments can differ by these alone.")
# A label's parts, in order, joined by the separator; a run resumed under another environment has the last part.
ENVIRONMENT_PARTS: tuple[str, ...] = ("CPU kernels", "BLAS", "threads", "CPU", "resumed under")
ENVIRONMENT_SEPARATOR = " · "
RESUMED_UNDER = "resumed under "


def environment_parts(environment: Mapping[str, Any]) -> list[str]:
    """The first four :data:`ENVIRONMENT_PARTS` of one ``meta.json`` environment record."""
    kernels = str(environment.get("cpu_capability") or "unknown kernels")
    if environment.get("aten_cpu_capability") is not None:
        kernels += f" (ATEN_CPU_CAPABILITY={environment['aten_cpu_capability']})"
    threads = environment.get("threads")
    cpu, machine = environment.get("cpu"), environment.get("machine")
    return [kernels, str(environment.get("blas") or "unknown BLAS"),
            f"{threads} thread{'' if threads == 1 else 's'}",
            f"{cpu} ({machine})" if cpu and machine and cpu != machine else str(cpu or machine or "unknown CPU")]


def environment_label(meta: Mapping[str, Any]) -> str | None:
    """A run's numeric environment as one label (None when unrecorded); a resume elsewhere adds what changed."""
    environment = meta.get("environment")
    if not isinstance(environment, Mapping):
        return None
    parts = environment_parts(environment)
    changed, previous = [], parts
    for change in meta.get("environment_changes") or ():
        current = environment_parts(change)
        changed.append(", ".join(part for part, before in zip(current, previous, strict=True) if part != before))
        previous = current
    if changed:
        parts.append(RESUMED_UNDER + "; then ".join(changed))
    return ENVIRONMENT_SEPARATOR.join(parts)


def _by_environment(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Environment label -> the included runs' names, the most common environment first (ties by label)."""
    included = runs[runs["included"]]
    labels = included["environment"] if "environment" in included.columns else [None] * len(included)
    groups: dict[str, list[str]] = {}
    for run, label in zip(included["run"].astype(str), labels, strict=True):
        groups.setdefault(UNKNOWN_ENVIRONMENT if pd.isna(label) else str(label), []).append(run)
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def abbreviated(names: Sequence[str], shown: int = SHOWN_RUN_NAMES) -> str:
    """``a, b, c, d, ... (9 in all)``."""
    names = list(names)
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def _label_parts(label: str) -> dict[str, str]:
    """A label's :data:`ENVIRONMENT_PARTS` (``resumed under`` empty for a run never resumed elsewhere)."""
    if label == UNKNOWN_ENVIRONMENT:
        return dict.fromkeys(ENVIRONMENT_PARTS[:-1], UNKNOWN_ENVIRONMENT) | {ENVIRONMENT_PARTS[-1]: ""}
    parts = label.split(ENVIRONMENT_SEPARATOR)
    resumed = parts[len(ENVIRONMENT_PARTS) - 1:]
    return {**dict(zip(ENVIRONMENT_PARTS[:-1], parts, strict=False)),
            ENVIRONMENT_PARTS[-1]: ENVIRONMENT_SEPARATOR.join(resumed).removeprefix(RESUMED_UNDER)}


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per numeric environment of the included runs, the most common first: its parts, runs, run names."""
    rows = [{**_label_parts(label), "runs": len(names), "run names": abbreviated(names)}
            for label, names in _by_environment(runs).items()]
    table = pd.DataFrame(rows, columns=[*ENVIRONMENT_PARTS, "runs", "run names"])
    if not table[ENVIRONMENT_PARTS[-1]].astype(bool).any():
        table = table.drop(columns=ENVIRONMENT_PARTS[-1])
    return table


def mixed_environment_warning(runs: pd.DataFrame) -> str | None:
    """The warning for included runs of several numeric environments or resumed under another; None otherwise."""
    groups = _by_environment(runs)
    resumed = [label for label in groups if ENVIRONMENT_SEPARATOR + RESUMED_UNDER in label]
    if len(groups) <= 1 and not resumed:
        return None
    listed = "; ".join(f"`{label}` ({len(names)} run{'s' if len(names) > 1 else ''}: {abbreviated(names)})"
                       for label, names in groups.items())
    head = (f"**Runs from {len(groups)} numeric environments are compared**" if len(groups) > 1
            else "**A run changed numeric environment on resume**")
    within = ("; a run resumed under another environment mixes two within itself" if resumed else "")
    return (f"{head}: {listed}. CPU kernels change a run's numbers (e.g. the warm start's accuracy), so a difference "
            f"between groups may be a difference between machines{within}; rerun the runs on one machine with the same "
            "`ATEN_CPU_CAPABILITY` and threads, or compare runs of one environment only (section Environment).")
