"""Group columns: checking them, grouping runs by them, selecting runs by their values (by value and type, never
through their text; a missing value matches only a missing one)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from dataflex_rl.tracking.identity import same_arm_mask

# (stratum keys, {stratum's group_key: the baseline group's key}), from baseline_strata
Strata = tuple[list[str], dict[tuple[Any, ...], tuple[Any, ...]]]


def check_columns(frame: pd.DataFrame, columns: Sequence[str], argument: str) -> None:
    """Raise a KeyError naming ``argument`` unless ``frame`` has every one of ``columns``."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KeyError(f"{argument}={list(columns)!r}: no column {missing} (columns: {list(frame.columns)})")


def rows_of(frame: pd.DataFrame, column: str, value: str) -> pd.DataFrame:
    """The rows whose ``column`` equals ``value``; a KeyError listing the values there are when none does."""
    rows = frame[(frame[column] == value).to_numpy(dtype=bool)]
    if rows.empty:
        raise KeyError(f"{column}={value!r} is not in the table; available: {sorted(map(str, frame[column].unique()))}")
    return rows


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and math.isnan(value))


def group_key(values: Iterable[Any]) -> tuple[Any, ...]:
    """Group values as a dict key by value and type: numpy scalars as Python scalars, every missing value None."""
    return tuple(None if _missing(value) else value.item() if isinstance(value, np.generic) else value
                 for value in values)


def matching_rows(frame: pd.DataFrame, selector: Mapping[str, Any]) -> np.ndarray:
    """Mask of the rows equal to every ``selector`` item by value and type (floats as one arm by
    :func:`~dataflex_rl.tracking.identity.same_arm`)."""
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in selector.items():
        values = frame[column]
        if _missing(wanted):
            mask &= values.isna().to_numpy(dtype=bool)
        elif (pd.api.types.is_float_dtype(values.dtype) and isinstance(wanted, numbers.Real)
              and not isinstance(wanted, (bool, np.bool_))):  # the arm rule (tracking.identity.same_arm)
            mask &= same_arm_mask(values.to_numpy(dtype=np.float64), float(wanted))
        else:
            mask &= (values == wanted).to_numpy(dtype=bool, na_value=False)
    return mask


def group_items(frame: pd.DataFrame, by: Sequence[str]) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """``(key tuple, row positions)`` per group of ``by``, ordered by the keys' text (stable for random draws)."""
    indices = frame.groupby(list(by), dropna=False, sort=True, observed=True).indices
    items = [((key if isinstance(key, tuple) else (key,)), positions) for key, positions in indices.items()]
    return sorted(items, key=lambda item: tuple(str(part) for part in item[0]))


def baseline_strata(summaries: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any]) -> Strata:
    """``(stratum keys, {stratum: baseline group key})``: the group keys outside ``baseline`` on which the baseline
    runs differ (``trainer.lr`` for alpha = 0 at each learning rate); without any, one baseline group."""
    baseline_groups = summaries.loc[matching_rows(summaries, baseline), list(group_keys)].drop_duplicates()
    strata_keys = [key for key in group_keys
                   if key not in baseline and baseline_groups[key].nunique(dropna=False) > 1]
    if len(baseline_groups) == 0 or (not strata_keys and len(baseline_groups) != 1):
        found = baseline_groups.to_dict("records")
        raise ValueError(f"baseline={baseline!r} selects {len(found)} groups of group_keys={list(group_keys)!r} "
                         f"({found[:5]}); it must select exactly one (add keys to the baseline)")
    positions = [list(group_keys).index(key) for key in strata_keys]
    baseline_keys: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in baseline_groups.itertuples(index=False):
        stratum = group_key(row[i] for i in positions)
        if stratum in baseline_keys:
            raise ValueError(f"baseline={baseline!r} selects two groups with {dict(zip(strata_keys, stratum))}: "
                             f"{baseline_keys[stratum]} and {tuple(row)}; add keys to the baseline")
        baseline_keys[stratum] = tuple(row)
    return strata_keys, baseline_keys


def group_text(values: Mapping[str, Any]) -> str:
    """``alpha=0.5, trainer.lr=0.0001``."""
    return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in values.items())
