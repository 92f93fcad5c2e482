"""The group columns of the analysis tables: checking them, grouping runs by them, selecting runs by their values.

Group values compare by value and type everywhere (never through their text): a selector's ``0.5`` selects the float
0.5 of a float column (within ``np.isclose``, so a computed 0.30000000000000004 selects alpha 0.3) and never the text
``"0.5"``; ``1`` and ``1.0`` are equal numbers; a missing value (None, NaN, ``pd.NA``) matches only a missing one.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

# (stratum keys, {stratum's group_key: the baseline group's key}), from baseline_strata
Strata = tuple[list[str], dict[tuple[Any, ...], tuple[Any, ...]]]


def check_columns(frame: pd.DataFrame, columns: Sequence[str], argument: str) -> None:
    """Raise a KeyError naming ``argument`` and the available columns unless ``frame`` has every one of ``columns``."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KeyError(f"{argument}={list(columns)!r}: no column {missing} (columns: {list(frame.columns)})")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and math.isnan(value))


def group_key(values: Iterable[Any]) -> tuple[Any, ...]:
    """Group-column values as a dict key that compares by value and type: numpy scalars become Python scalars and
    every missing value (None, NaN, ``pd.NA``) the same None; ``0.5`` and ``np.float64(0.5)`` are one key, ``"0.5"``
    another."""
    return tuple(None if _missing(value) else value.item() if isinstance(value, np.generic) else value
                 for value in values)


def matching_rows(frame: pd.DataFrame, selector: Mapping[str, Any]) -> np.ndarray:
    """Boolean mask ``(len(frame),)`` of the rows whose columns equal every ``selector`` item by value and type.

    A number selects equal numbers (in a float column within ``np.isclose``, so a computed 0.30000000000000004 selects
    alpha 0.3), text selects equal text (``"0.5"`` never selects 0.5), a missing value (None, NaN) the missing ones.
    """
    mask = np.ones(len(frame), dtype=bool)
    for column, wanted in selector.items():
        values = frame[column]
        if _missing(wanted):
            mask &= values.isna().to_numpy(dtype=bool)
        elif (pd.api.types.is_float_dtype(values.dtype) and isinstance(wanted, numbers.Real)
              and not isinstance(wanted, (bool, np.bool_))):
            mask &= np.isclose(values.to_numpy(dtype=np.float64), float(wanted))
        else:
            mask &= (values == wanted).to_numpy(dtype=bool, na_value=False)
    return mask


def group_items(frame: pd.DataFrame, by: Sequence[str]) -> list[tuple[tuple[Any, ...], np.ndarray]]:
    """``(key tuple, row positions)`` per group of the ``by`` columns, in a stable order (so a fixed random_state gives
    fixed draws): by the keys' text, which also orders keys of mixed types and NaN."""
    indices = frame.groupby(list(by), dropna=False, sort=True, observed=True).indices
    items = [((key if isinstance(key, tuple) else (key,)), positions) for key, positions in indices.items()]
    return sorted(items, key=lambda item: tuple(str(part) for part in item[0]))


def baseline_strata(summaries: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any]) -> Strata:
    """``(stratum keys, {stratum's group_key: baseline group key})``.

    The stratum keys are the group keys outside ``baseline`` on which the baseline runs differ (``trainer.lr`` when
    ``baseline={"alpha": 0}`` selects alpha = 0 at each learning rate): each group is compared with the baseline
    group of its own stratum. None such: one stratum, and ``baseline`` must select exactly one group.
    """
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
