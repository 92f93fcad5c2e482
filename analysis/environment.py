"""The numeric environments of a sweep's runs, for the report: which CPU kernels, BLAS, threads and CPU each included
run's numbers came from (the run table's ``environment`` label, :func:`analysis.load.environment_label`).

The same warm start gives a different greedy accuracy under torch's AVX512 and AVX2 kernels, so runs from several
environments may differ by machine rather than by mechanism. :func:`environment_table` lists the environments (the
report's Environment section); :func:`mixed_environment_warning` is the report's warning when the included runs come
from more than one, or a run changed environment on resume. A run whose ``meta.json`` records no environment counts
as the environment ``unknown``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from analysis.load import ENVIRONMENT_PARTS, ENVIRONMENT_SEPARATOR, RESUMED_UNDER

UNKNOWN_ENVIRONMENT = "unknown"
SHOWN_RUN_NAMES = 4
ENVIRONMENT_NOTE = ("Each included run's numeric environment, from its `meta.json`: the CPU kernel set torch "
                    "dispatched to (with `ATEN_CPU_CAPABILITY` when it capped it), the BLAS torch was built with, "
                    "torch's threads and the CPU; runs of different environments can differ by these alone.")


def _included_labels(runs: pd.DataFrame) -> pd.Series:
    """The ``environment`` label of every included run (``unknown`` where none is recorded), indexed by run name."""
    included = runs[runs["included"]]
    labels = included["environment"] if "environment" in included.columns else pd.Series(None, index=included.index)
    return pd.Series([UNKNOWN_ENVIRONMENT if pd.isna(label) else str(label) for label in labels],
                     index=included["run"].astype(str).to_numpy(), dtype=object)


def _by_environment(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Environment label -> the included runs' names, the most common environment first (ties by label)."""
    groups: dict[str, list[str]] = {}
    for run, label in _included_labels(runs).items():
        groups.setdefault(label, []).append(run)
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def abbreviated(names: Sequence[str], shown: int = SHOWN_RUN_NAMES) -> str:
    """``a, b, c, d, ... (9 in all)``: the first ``shown`` names, and how many there are when some are left out."""
    names = list(names)
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f", ... ({len(names)} in all)"


def _label_parts(label: str) -> dict[str, str]:
    """A label's :data:`~analysis.load.ENVIRONMENT_PARTS` (``resumed under`` empty for a run never resumed elsewhere);
    every part ``unknown`` for the unknown environment."""
    if label == UNKNOWN_ENVIRONMENT:
        return dict.fromkeys(ENVIRONMENT_PARTS[:-1], UNKNOWN_ENVIRONMENT) | {ENVIRONMENT_PARTS[-1]: ""}
    parts = label.split(ENVIRONMENT_SEPARATOR)
    resumed = parts[len(ENVIRONMENT_PARTS) - 1:]
    return {**dict(zip(ENVIRONMENT_PARTS[:-1], parts, strict=False)),
            ENVIRONMENT_PARTS[-1]: ENVIRONMENT_SEPARATOR.join(resumed).removeprefix(RESUMED_UNDER)}


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct numeric environment among the included runs of a run table, the most common first:
    the label's parts (``CPU kernels``, ``BLAS``, ``threads``, ``CPU``, and ``resumed under`` when a run was resumed
    under another environment), ``runs`` (how many) and ``run names`` (abbreviated). No rows without included runs."""
    rows = [{**_label_parts(label), "runs": len(names), "run names": abbreviated(names)}
            for label, names in _by_environment(runs).items()]
    table = pd.DataFrame(rows, columns=[*ENVIRONMENT_PARTS, "runs", "run names"])
    if not table[ENVIRONMENT_PARTS[-1]].astype(bool).any():
        table = table.drop(columns=ENVIRONMENT_PARTS[-1])
    return table


def mixed_environment_warning(runs: pd.DataFrame) -> str | None:
    """The report's warning when the included runs come from more than one numeric environment or a run changed
    environment on resume (its label then says ``resumed under``); None when all share one."""
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
