"""Curves over steps: each group's mean and IQM curves with intervals, and per-step paired differences against the
baseline with a simultaneous Bonferroni-t band (docs/analysis.md, "Where in training two groups differ")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.aggregate import default_baseline, default_group_keys, segments
from analysis.frames import IDENTITY_COLUMNS
from analysis.groups import baseline_strata, check_columns, group_items, group_key, rows_of
from analysis.statistics import DEFAULT_CONFIDENCE, rowwise_iqm, rowwise_iqm_interval, check_confidence, t_bounds

BAND_METHOD = "bonferroni-t"
# Simultaneous coverage of the nominal 95% band by seeds, measured by tests/analysis/synthetic.py's
# simulate_band_coverage (8 steps, lag-one correlation 0.7, 20000 replicates); the report quotes it.
MEASURED_BAND_COVERAGE: dict[int, float] = {3: 0.953, 5: 0.952, 10: 0.954}
TOO_FEW_PAIRS_NOTE = "fewer than 2 paired seeds: no interval"
CURVE_DIFFERENCE_COLUMNS: tuple[str, ...] = (
    "metric", "step", "n", "mean", "baseline_mean", "mean_diff", "std_diff", "ci_low", "ci_high", "band_low",
    "band_high", "band_steps", "band_method", "confidence", "note")


def align_curves(long: pd.DataFrame, metric: str, step_grid: Any = None,
                 extra_columns: Sequence[str] = ()) -> pd.DataFrame:
    """One metric of every run on a step grid ``(n_grid, n_runs)`` (default every logged step), forward-filled
    within each run's logged steps and NaN outside them; columns: the identity plus ``extra_columns``."""
    frame, starts, ends = segments(rows_of(long, "metric", metric))
    steps = frame["step"].to_numpy(dtype=np.int64)
    values = frame["value"].to_numpy(dtype=np.float64)
    grid = np.unique(steps) if step_grid is None else np.asarray(step_grid, dtype=np.int64)
    if grid.ndim != 1 or (grid.size > 1 and np.any(np.diff(grid) <= 0)):
        raise ValueError("step_grid must be a 1-D increasing sequence of steps")
    matrix = np.full((grid.size, starts.size), np.nan)
    for column, (start, end) in enumerate(zip(starts, ends, strict=True)):
        run_steps = steps[start:end]
        position = np.searchsorted(run_steps, grid, side="right") - 1
        covered = (position >= 0) & (grid <= run_steps[-1])
        matrix[covered, column] = values[start:end][position[covered]]
    id_columns = list(dict.fromkeys([*IDENTITY_COLUMNS, *extra_columns]))
    check_columns(frame, id_columns, "extra_columns")
    identity = frame.iloc[starts][id_columns]
    columns = pd.MultiIndex.from_frame(identity.astype(dict.fromkeys(id_columns, object)))
    return pd.DataFrame(matrix, index=pd.Index(grid, name="step"), columns=columns)


def aggregate_curves(long: pd.DataFrame, metric: str, *, group_keys: Sequence[str] = ("alpha",), step_grid: Any = None,
                     confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Per (group, step) covered: ``n, mean, std, iqm``, the mean's t interval and the IQM's Tukey-McLaughlin one."""
    check_confidence(confidence)
    aligned = align_curves(long, metric, step_grid, [k for k in group_keys if k not in IDENTITY_COLUMNS])
    columns = aligned.columns.to_frame(index=False)
    check_columns(columns, group_keys, "group_keys")
    matrix = aligned.to_numpy()
    grid = aligned.index.to_numpy()
    frames = []
    grouped = columns.groupby(list(group_keys), dropna=False, sort=True).indices
    for group, positions in sorted(grouped.items(), key=lambda item: str(item[0])):
        block = matrix[:, positions]
        covered = np.isfinite(block)
        count = covered.sum(axis=1)
        rows = count > 0
        block, covered, count = block[rows], covered[rows], count[rows]
        filled = np.where(covered, block, 0.0)
        mean = filled.sum(axis=1) / count
        with np.errstate(invalid="ignore", divide="ignore"):
            variance = ((np.where(covered, block - mean[:, None], 0.0)) ** 2).sum(axis=1) / (count - 1)
        low, high = t_bounds(mean, np.sqrt(variance / count), count - 1, confidence)
        iqm = rowwise_iqm(block)
        iqm_low, iqm_high = rowwise_iqm_interval(block, confidence, iqm)
        values = group if isinstance(group, tuple) else (group,)
        frames.append(pd.DataFrame({
            **{key: [value] * int(rows.sum()) for key, value in zip(group_keys, values, strict=True)},
            "step": grid[rows], "n": count, "mean": mean, "std": np.where(count > 1, np.sqrt(variance), np.nan),
            "iqm": iqm, "ci_low": low, "ci_high": high, "iqm_ci_low": iqm_low, "iqm_ci_high": iqm_high}))
    if not frames:
        return pd.DataFrame(columns=[*group_keys, "step", "n", "mean", "std", "iqm", "ci_low", "ci_high",
                                     "iqm_ci_low", "iqm_ci_high"])
    return pd.concat(frames, ignore_index=True)


def _baseline_of_groups(rows: pd.DataFrame, group_keys: Sequence[str],
                        baseline: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row -> group index; per group: its first row, its baseline's group index (or -1), whether it is a baseline."""
    strata_keys, baseline_keys = baseline_strata(rows, group_keys, baseline)
    items = group_items(rows, group_keys)
    keys = [group_key(key) for key, _ in items]
    row_group = np.empty(len(rows), dtype=np.int64)
    first_rows = np.array([positions.min() for _, positions in items], dtype=np.int64)
    for index, (_, positions) in enumerate(items):
        row_group[positions] = index
    index_of = {key: index for index, key in enumerate(keys)}
    baselines = {group_key(key) for key in baseline_keys.values()}
    positions = [list(group_keys).index(key) for key in strata_keys]
    references = [baseline_keys.get(tuple(key[i] for i in positions)) for key in keys]
    group_baseline = np.array([-1 if reference is None else index_of.get(group_key(reference), -1)
                               for reference in references], dtype=np.int64)
    is_baseline = np.array([key in baselines for key in keys], dtype=bool)
    return row_group, first_rows, group_baseline, is_baseline


def curve_differences(long: pd.DataFrame, metric: str, *, group_keys: Sequence[str] | None = None,
                      baseline: Mapping[str, Any] | None = None, pair_on: Sequence[str] = ("seed",),
                      confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Per (group, step): the paired difference of ``metric`` against the baseline with a pointwise paired-t
    interval and a simultaneous Bonferroni-t band (:data:`CURVE_DIFFERENCE_COLUMNS`)."""
    check_confidence(confidence)
    rows, _, _ = segments(rows_of(long, "metric", metric))  # sorted by run and step; a repeated step keeps its last row
    group_keys = tuple(group_keys) if group_keys is not None else default_group_keys(rows)
    check_columns(rows, [*group_keys, *pair_on], "group_keys/pair_on")
    if baseline is None:
        baseline = default_baseline(rows, group_keys)
        if baseline is None:
            raise ValueError(f"no single baseline group among group_keys={list(group_keys)!r} (alpha = 0 or the "
                             "mechanism label `baseline`); pass baseline={...} selecting one")
    row_group, first_rows, group_baseline, is_baseline = _baseline_of_groups(rows, group_keys, dict(baseline))
    pair_columns = [f"pair_{position}" for position in range(len(pair_on))]
    table = pd.DataFrame({"group": row_group, "step": rows["step"].to_numpy(dtype=np.int64),
                          "value": rows["value"].to_numpy(dtype=np.float64),
                          **{name: rows[c].to_numpy() for name, c in zip(pair_columns, pair_on, strict=True)}})
    # a run without a seed (or other pair_on value) pairs with nothing
    table = table[np.isfinite(table["value"].to_numpy()) & table[pair_columns].notna().all(axis=1).to_numpy()]

    reference = table[is_baseline[table["group"].to_numpy()]].rename(
        columns={"group": "baseline_group", "value": "baseline_value"})
    repeated = reference.duplicated(["baseline_group", *pair_columns, "step"])
    if repeated.any():
        examples = reference.loc[repeated, [*pair_columns, "step"]].head(5).set_axis([*pair_on, "step"], axis=1)
        raise ValueError(f"baseline runs repeat pair_on={list(pair_on)!r} values at one step for {metric!r} "
                         f"({examples.to_dict('records')}); pair on more columns, e.g. pair_on=('sweep', 'seed')")
    compared = table[~is_baseline[table["group"].to_numpy()]]
    compared = compared.assign(baseline_group=group_baseline[compared["group"].to_numpy()])
    # like paired_differences: a group's runs repeating a pair_on value keep the last one
    compared = compared[compared["baseline_group"] >= 0].drop_duplicates(
        ["group", *pair_columns, "step"], keep="last")
    paired = compared.merge(reference, on=["baseline_group", *pair_columns, "step"], how="inner", sort=False)
    paired["difference"] = paired["value"] - paired["baseline_value"]
    per_step = paired.groupby(["group", "step"], sort=True).agg(
        n=("difference", "size"), mean=("value", "mean"), baseline_mean=("baseline_value", "mean"),
        mean_diff=("difference", "mean"), std_diff=("difference", "std")).reset_index()
    group_rows = rows.iloc[first_rows][list(group_keys)]
    group = per_step["group"].to_numpy(dtype=np.int64)
    n = per_step["n"].to_numpy(dtype=np.int64)
    with_interval = n >= 2
    # K per comparison: the steps that have an interval
    band_steps = np.bincount(group[with_interval], minlength=len(group_rows))[group]
    standard_error = np.where(with_interval, per_step["std_diff"].to_numpy(dtype=np.float64) / np.sqrt(n), np.nan)
    mean_diff = per_step["mean_diff"].to_numpy(dtype=np.float64)
    # Bonferroni: each of the K steps at level a / K, i.e. the quantile t_{1 - a/(2K), n-1}
    band_confidence = 1.0 - (1.0 - confidence) / np.maximum(band_steps, 1)
    result = group_rows.iloc[group].reset_index(drop=True).assign(
        metric=metric, step=per_step["step"].to_numpy(), n=n,
        **{column: per_step[column].to_numpy(dtype=np.float64) for column in ("mean", "baseline_mean", "std_diff")},
        mean_diff=mean_diff, band_steps=band_steps.astype(np.int64), band_method=BAND_METHOD,
        confidence=float(confidence), note=np.where(with_interval, "", TOO_FEW_PAIRS_NOTE))
    result["ci_low"], result["ci_high"] = t_bounds(mean_diff, standard_error, n - 1, confidence)
    result["band_low"], result["band_high"] = t_bounds(mean_diff, standard_error, n - 1, band_confidence)
    return result[[*group_keys, *CURVE_DIFFERENCE_COLUMNS]]
