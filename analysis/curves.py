"""Curves over training steps: runs aligned on a step grid, each group's mean and IQM curves with their intervals
(rliable's sample-efficiency curves), and where in training two groups differ (per-step paired differences against
the baseline, with a simultaneous band).

Everything takes the long table of :mod:`analysis.load` (``sweep, run, ..., alpha, seed, step, metric, value``) and
returns a new DataFrame; the simulations take a ``random_state``.

- **Curve alignment** (:func:`align_curves`): each run's values are forward-filled onto a common step grid between its
  first and last logged step; grid points before its first or after its last step are NaN (never extrapolated), and
  a group's statistic at a step uses only the runs that cover that step (``n`` says how many).
- **Sample-efficiency curves** (:func:`aggregate_curves`): at each step the Student-t interval of the mean and the
  Tukey-McLaughlin interval of the IQM over the runs covering it (:mod:`analysis.statistics`).

Differences against the baseline (one comparison = one group against its baseline group, one metric; ``n_k`` the
seeds both logged the metric at step ``k``, ``d_ik`` = group minus baseline on seed ``i`` at step ``k``):

- **Steps compared**: every step at which both groups logged the metric for the same seed (the exact logged values:
  no forward fill, no interpolation), with ``n_k`` counting those seeds.
- **Pointwise interval** at step ``k``: paired t, ``mean_k(d) +- t_{1-a/2, n_k-1} s_k / sqrt(n_k)`` (``s_k`` the
  standard deviation of the ``d_ik``, ``ddof=1``); exact ``1 - a`` coverage at each step for normal differences at
  every ``n_k >= 2``. Read at many steps at once, some of them miss by chance: with ``K`` steps about ``a K`` do.
- **Simultaneous band** (:data:`BAND_METHOD` ``"bonferroni-t"``): the same formula with ``t_{1-a/(2K), n_k-1}``,
  ``K`` the steps of the comparison that have an interval (``n_k >= 2``). By the union bound the probability that the
  whole true difference curve lies inside the band is at least ``1 - a`` for any dependence between steps (evaluations
  of one run are strongly correlated), at any ``n >= 2``; a bootstrap or max-t band needs more seeds than sweeps have
  for its coverage. Bonferroni is conservative when steps are correlated: :func:`simulate_band_coverage` measures how
  much (``docs/analysis.md`` has the numbers at 3, 5 and 10 seeds).
- A step with fewer than 2 paired seeds gets the mean difference, NaN intervals and the note
  :data:`TOO_FEW_PAIRS_NOTE`; it does not count in ``K``.

The baseline is the one :func:`analysis.aggregate.default_baseline` picks (``alpha = 0``, or the ``baseline``
mechanism label), and a baseline selecting one group per value of the other factors (``alpha = 0`` at each learning
rate) compares each group with the baseline of its own stratum, as :func:`analysis.aggregate.paired_differences` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.aggregate import default_baseline, default_group_keys, segments
from analysis.frames import IDENTITY_COLUMNS
from analysis.groups import baseline_strata, check_columns, group_items, group_key
from analysis.statistics import (
    DEFAULT_CONFIDENCE,
    RandomState,
    _rowwise_interquartile_mean,
    _rowwise_iqm_interval,
    check_confidence,
    t_bounds,
)

BAND_METHOD = "bonferroni-t"
# Simultaneous coverage of the nominal 95% band measured by simulate_band_coverage (8 steps, AR(1) lag-one
# correlation 0.7, 20000 replicates, random_state 1), by number of seeds; the report quotes it, docs/analysis.md lists
# it with the other measurements, and tests/analysis/test_analysis_curves.py reproduces it.
MEASURED_BAND_COVERAGE: dict[int, float] = {3: 0.953, 5: 0.952, 10: 0.954}
TOO_FEW_PAIRS_NOTE = "fewer than 2 paired seeds: no interval"
CURVE_DIFFERENCE_COLUMNS: tuple[str, ...] = (
    "metric", "step", "n", "mean", "baseline_mean", "mean_diff", "std_diff", "ci_low", "ci_high", "band_low",
    "band_high", "band_steps", "band_method", "confidence", "note")


def _select_metric(long: pd.DataFrame, metric: str) -> pd.DataFrame:
    available = long["metric"].unique()
    if metric not in set(available):
        raise KeyError(f"metric={metric!r} is not in the table; available: {sorted(map(str, available))}")
    return long[long["metric"] == metric]


def align_curves(
    long: pd.DataFrame, metric: str, step_grid: Any = None, extra_columns: Sequence[str] = ()
) -> pd.DataFrame:
    """One metric of every run on a common step grid: DataFrame ``(n_grid, n_runs)``.

    Index ``step`` = ``step_grid`` (default: every step any run logged the metric at); columns a MultiIndex of the
    identity columns plus ``extra_columns`` of ``long`` (one column per run). Values are forward-filled within each
    run's ``[first, last]`` logged step and NaN outside it (see module doc).
    """
    frame, starts, ends = segments(_select_metric(long, metric))
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


def aggregate_curves(
    long: pd.DataFrame,
    metric: str,
    *,
    group_keys: Sequence[str] = ("alpha",),
    step_grid: Any = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_bootstrap: int = 1000,
    random_state: RandomState = 0,
) -> pd.DataFrame:
    """Per group and grid step: ``n, mean, std, iqm``, the Student-t interval of the mean and the Tukey-McLaughlin
    interval of the IQM over runs (rliable's sample-efficiency curves, with intervals that cover at a few seeds).

    Returns one row per (group, step) where at least one run of the group covers the step, columns
    ``[*group_keys, step, n, mean, std, iqm, ci_low, ci_high, iqm_ci_low, iqm_ci_high]``; ``ci_*`` is
    ``mean +- t_{(1+c)/2, n-1} std / sqrt(n)`` with the step's own ``n`` (NaN where n < 2), ``iqm_ci_*`` the
    trimmed-mean t interval of the module doc (equal to ``ci_*`` below 4 runs, where the IQM trims nothing).
    ``n_bootstrap`` and ``random_state`` are accepted for compatibility and unused: the bands need no resampling.
    """
    check_confidence(confidence)
    aligned = align_curves(long, metric, step_grid, [k for k in group_keys if k not in IDENTITY_COLUMNS])
    columns = aligned.columns.to_frame(index=False)
    check_columns(columns, group_keys, "group_keys")
    matrix = aligned.to_numpy()
    grid = aligned.index.to_numpy()
    del n_bootstrap, random_state  # kept in the signature for existing callers
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
        values = group if isinstance(group, tuple) else (group,)
        frame = pd.DataFrame({key: [value] * int(rows.sum()) for key, value in zip(group_keys, values, strict=True)})
        frame["step"] = grid[rows]
        frame["n"] = count
        frame["mean"] = mean
        frame["std"] = np.where(count > 1, np.sqrt(variance), np.nan)
        frame["iqm"] = _rowwise_interquartile_mean(block)
        frame["ci_low"] = low
        frame["ci_high"] = high
        frame["iqm_ci_low"], frame["iqm_ci_high"] = _rowwise_iqm_interval(block, confidence,
                                                                          frame["iqm"].to_numpy())
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*group_keys, "step", "n", "mean", "std", "iqm", "ci_low", "ci_high",
                                     "iqm_ci_low", "iqm_ci_high"])
    return pd.concat(frames, ignore_index=True)



def _baseline_of_groups(
    rows: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(row -> group index (n_rows,), group -> its first row (n_groups,), group -> its baseline's group index or -1
    (n_groups,), group -> is a baseline (n_groups,))``, groups in :func:`analysis.groups.group_items` order."""
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
    group_baseline = np.full(len(keys), -1, dtype=np.int64)
    for index, key in enumerate(keys):
        reference = baseline_keys.get(tuple(key[i] for i in positions))
        if reference is not None:
            group_baseline[index] = index_of.get(group_key(reference), -1)
    is_baseline = np.array([key in baselines for key in keys], dtype=bool)
    return row_group, first_rows, group_baseline, is_baseline


def curve_differences(
    long: pd.DataFrame,
    metric: str,
    *,
    group_keys: Sequence[str] | None = None,
    baseline: Mapping[str, Any] | None = None,
    pair_on: Sequence[str] = ("seed",),
    confidence: float = DEFAULT_CONFIDENCE,
) -> pd.DataFrame:
    """Per (non-baseline group, step): the paired difference of ``metric`` against the baseline, with a pointwise
    paired-t interval and a simultaneous Bonferroni-t band over the comparison's steps (definitions in the module doc).

    ``long``: the long table (one row per run, step and metric). ``group_keys``: default
    :func:`analysis.aggregate.default_group_keys`; ``baseline``: column values selecting the baseline group, default
    :func:`analysis.aggregate.default_baseline` (a ValueError when there is none). Runs are paired on ``pair_on`` (the
    seed) at the same step; a run logging one step twice keeps its last value, a run without a ``pair_on`` value
    pairs with nothing, and baseline runs repeating a ``pair_on`` value raise (pair on more columns, e.g.
    ``("sweep", "seed")``).

    Returns one row per (group, step) logged by both the group and its baseline for at least one common seed, sorted
    by group then step: ``[*group_keys, *CURVE_DIFFERENCE_COLUMNS]`` with ``n`` (paired seeds at the step), ``mean``
    and ``baseline_mean`` (over those seeds), ``mean_diff`` and ``std_diff`` (of the paired differences),
    ``ci_low/ci_high`` (pointwise, level ``confidence``), ``band_low/band_high`` (simultaneous over the group's
    ``band_steps`` steps with ``n >= 2``, level ``confidence``), ``band_method`` (:data:`BAND_METHOD`),
    ``confidence``, and ``note`` (:data:`TOO_FEW_PAIRS_NOTE` where ``n < 2``, else empty). No row for the baseline
    groups themselves, nor for a group whose stratum has no baseline.
    """
    check_confidence(confidence)
    rows, _, _ = segments(_select_metric(long, metric))  # sorted by run and step; a repeated step keeps its last row
    group_keys = tuple(group_keys) if group_keys is not None else default_group_keys(rows)
    check_columns(rows, [*group_keys, *pair_on], "group_keys/pair_on")
    if baseline is None:
        baseline = default_baseline(rows, group_keys)
        if baseline is None:
            raise ValueError(f"no single baseline group among group_keys={list(group_keys)!r} (alpha = 0 or the "
                             "mechanism label `baseline`); pass baseline={...} selecting one")
    row_group, first_rows, group_baseline, is_baseline = _baseline_of_groups(rows, group_keys, dict(baseline))
    table = pd.DataFrame({"group": row_group, "step": rows["step"].to_numpy(dtype=np.int64),
                          "value": rows["value"].to_numpy(dtype=np.float64)})
    for position, column in enumerate(pair_on):
        table[f"pair_{position}"] = rows[column].to_numpy()
    pair_columns = [f"pair_{position}" for position in range(len(pair_on))]
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
    return _with_intervals(per_step, group_rows, group_keys, metric, confidence)


def _with_intervals(
    per_step: pd.DataFrame, group_rows: pd.DataFrame, group_keys: Sequence[str], metric: str, confidence: float,
) -> pd.DataFrame:
    """The per-step paired statistics ``(group, step, n, mean, baseline_mean, mean_diff, std_diff)`` and each group's
    key columns ``group_rows`` (one row per group index) -> the output of :func:`curve_differences`: group columns,
    pointwise intervals and the Bonferroni-t band."""
    group = per_step["group"].to_numpy(dtype=np.int64)
    n = per_step["n"].to_numpy(dtype=np.int64)
    with_interval = n >= 2
    # K per comparison: the steps that have an interval
    band_steps = np.bincount(group[with_interval], minlength=len(group_rows))[group]
    standard_error = np.where(with_interval, per_step["std_diff"].to_numpy(dtype=np.float64) / np.sqrt(n), np.nan)
    mean_diff = per_step["mean_diff"].to_numpy(dtype=np.float64)
    # Bonferroni: each of the K steps at level a / K, i.e. the quantile t_{1 - a/(2K), n-1}
    band_confidence = 1.0 - (1.0 - confidence) / np.maximum(band_steps, 1)
    result = group_rows.iloc[group].reset_index(drop=True)
    result["metric"] = metric
    result["step"] = per_step["step"].to_numpy()
    result["n"] = n
    for column in ("mean", "baseline_mean", "mean_diff", "std_diff"):
        result[column] = per_step[column].to_numpy(dtype=np.float64)
    result["ci_low"], result["ci_high"] = t_bounds(mean_diff, standard_error, n - 1, confidence)
    result["band_low"], result["band_high"] = t_bounds(mean_diff, standard_error, n - 1, band_confidence)
    result["band_steps"] = band_steps.astype(np.int64)
    result["band_method"] = BAND_METHOD
    result["confidence"] = float(confidence)
    result["note"] = np.where(with_interval, "", TOO_FEW_PAIRS_NOTE)
    return result[[*group_keys, *CURVE_DIFFERENCE_COLUMNS]]


# --- coverage by simulation --------------------------------------------------------------------------------------


def simulate_band_coverage(
    n_seeds: int,
    *,
    n_replicates: int = 2000,
    n_steps: int = 8,
    autocorrelation: float = 0.7,
    confidence: float = DEFAULT_CONFIDENCE,
    random_state: RandomState = 0,
) -> dict[str, float]:
    """Coverage of :func:`curve_differences`' intervals on ``n_replicates`` simulated sweeps with a known truth.

    Each replicate is one sweep of ``n_seeds`` seeds x {baseline, treatment} evaluated at ``n_steps`` steps
    (:func:`analysis.synthetic.correlated_curve_table`: paired differences AR(1) across steps with lag-one
    correlation ``autocorrelation``, plus independent noise); all replicates go through one call of
    :func:`curve_differences` (group keys ``replicate, alpha``: each replicate's treatment against its own baseline).

    Returns ``n_seeds, n_steps, n_replicates``; ``pointwise``: the share of (replicate, step) intervals holding the
    true difference (nominal ``confidence``); ``simultaneous``: the share of replicates whose band holds the whole true
    curve (at least ``confidence`` by construction); ``pointwise_simultaneous``: the same for the pointwise intervals
    (why a band is needed); ``band_width_ratio``: band half-width over pointwise half-width.
    """
    from analysis.synthetic import correlated_curve_table

    long, truth = correlated_curve_table(n_seeds, n_replicates=n_replicates, n_steps=n_steps,
                                         autocorrelation=autocorrelation, random_state=random_state)
    metric = str(long["metric"].iloc[0])
    frame = curve_differences(long, metric, group_keys=("replicate", "alpha"), baseline={"alpha": 0.0},
                              confidence=confidence)
    true_difference = truth.set_index("step")["difference"].reindex(frame["step"]).to_numpy()
    inside_pointwise = ((frame["ci_low"] <= true_difference) & (true_difference <= frame["ci_high"])).to_numpy()
    inside_band = ((frame["band_low"] <= true_difference) & (true_difference <= frame["band_high"])).to_numpy()
    replicate = frame["replicate"].to_numpy()
    if len(frame) != n_replicates * n_steps:
        raise RuntimeError(f"expected {n_replicates * n_steps} compared steps, got {len(frame)}")
    whole_curve = pd.DataFrame({"replicate": replicate, "pointwise": inside_pointwise, "band": inside_band}).groupby(
        "replicate").all()
    return {"n_seeds": int(n_seeds), "n_steps": int(n_steps), "n_replicates": int(n_replicates),
            "pointwise": float(inside_pointwise.mean()), "simultaneous": float(whole_curve["band"].mean()),
            "pointwise_simultaneous": float(whole_curve["pointwise"].mean()),
            "band_width_ratio": float(np.mean((frame["band_high"] - frame["band_low"])
                                              / (frame["ci_high"] - frame["ci_low"])))}


def simulate_curve_interval_coverage(
    n_seeds: int,
    *,
    n_replicates: int = 4000,
    confidence: float = DEFAULT_CONFIDENCE,
    random_state: RandomState = 0,
) -> dict[str, float]:
    """Coverage of :func:`aggregate_curves`' mean and IQM intervals for normal data.

    One group of ``n_seeds`` runs whose values at each of ``n_replicates`` steps are independent N(0.5, 0.05): each
    step is one replicate, so one vectorised call measures them all. The true mean and IQM are both 0.5 (a symmetric
    distribution). Returns ``n_seeds, n_replicates, mean`` (coverage of the Student-t interval) and ``iqm`` (coverage
    of the Tukey-McLaughlin interval).
    """
    rng = np.random.default_rng(random_state)
    values = rng.normal(0.5, 0.05, size=(n_seeds, n_replicates))
    long = pd.DataFrame({
        "sweep": "simulated", "run": np.repeat([f"s{seed}" for seed in range(n_seeds)], n_replicates),
        "backend": "local", "mechanism": "reweight", "mechanism_label": "reweight", "alpha": 0.0,
        "seed": np.repeat(np.arange(n_seeds), n_replicates), "step": np.tile(np.arange(n_replicates), n_seeds),
        "metric": "simulated", "value": values.ravel()})
    curves = aggregate_curves(long, "simulated", confidence=confidence)
    covered_mean = (curves["ci_low"] <= 0.5) & (0.5 <= curves["ci_high"])
    covered_iqm = (curves["iqm_ci_low"] <= 0.5) & (0.5 <= curves["iqm_ci_high"])
    return {"n_seeds": int(n_seeds), "n_replicates": int(n_replicates), "mean": float(covered_mean.mean()),
            "iqm": float(covered_iqm.mean())}
