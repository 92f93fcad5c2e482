"""Where in training two groups differ: per-step paired differences against the baseline, with a simultaneous band.

Everything takes the long table of :mod:`analysis.load` (``sweep, run, ..., alpha, seed, step, metric, value``) and
returns a new DataFrame; the simulations take a ``random_state``.

Definitions (one comparison = one group against its baseline group, one metric; ``n_k`` the seeds both logged the
metric at step ``k``, ``d_ik`` = group minus baseline on seed ``i`` at step ``k``):

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

from analysis.aggregate import (
    DEFAULT_CONFIDENCE,
    RandomState,
    _baseline_strata,
    _check_columns,
    _check_confidence,
    _group_items,
    _segments,
    _select_metric,
    _t_quantiles,
    aggregate_curves,
    default_baseline,
    default_group_keys,
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


def _baseline_of_groups(
    rows: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(row -> group index (n_rows,), group -> its first row (n_groups,), group -> its baseline's group index or -1
    (n_groups,), group -> is a baseline (n_groups,))``, groups in :func:`analysis.aggregate._group_items` order."""
    strata_keys, baseline_keys = _baseline_strata(rows, group_keys, baseline)
    items = _group_items(rows, group_keys)
    keys = [key for key, _ in items]
    row_group = np.empty(len(rows), dtype=np.int64)
    first_rows = np.array([positions.min() for _, positions in items], dtype=np.int64)
    for index, (_, positions) in enumerate(items):
        row_group[positions] = index
    as_text = [tuple(str(part) for part in key) for key in keys]
    index_of = {text: index for index, text in enumerate(as_text)}
    baseline_texts = {tuple(str(part) for part in key) for key in baseline_keys.values()}
    positions = [list(group_keys).index(key) for key in strata_keys]
    group_baseline = np.full(len(keys), -1, dtype=np.int64)
    for index, text in enumerate(as_text):
        reference = baseline_keys.get(tuple(text[i] for i in positions))
        if reference is not None:
            group_baseline[index] = index_of.get(tuple(str(part) for part in reference), -1)
    is_baseline = np.array([text in baseline_texts for text in as_text], dtype=bool)
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
    _check_confidence(confidence)
    rows, _, _ = _segments(_select_metric(long, metric))  # sorted by run and step; a repeated step keeps its last row
    group_keys = tuple(group_keys) if group_keys is not None else default_group_keys(rows)
    _check_columns(rows, [*group_keys, *pair_on], "group_keys/pair_on")
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
    pointwise_half = _t_quantiles(confidence, n - 1) * standard_error
    # Bonferroni: each of the K steps at level a / K, i.e. the quantile t_{1 - a/(2K), n-1}
    band_confidence = 1.0 - (1.0 - confidence) / np.maximum(band_steps, 1)
    band_half = _t_quantiles(band_confidence, n - 1) * standard_error
    mean_diff = per_step["mean_diff"].to_numpy(dtype=np.float64)
    result = group_rows.iloc[group].reset_index(drop=True)
    result["metric"] = metric
    result["step"] = per_step["step"].to_numpy()
    result["n"] = n
    for column in ("mean", "baseline_mean", "mean_diff", "std_diff"):
        result[column] = per_step[column].to_numpy(dtype=np.float64)
    result["ci_low"], result["ci_high"] = mean_diff - pointwise_half, mean_diff + pointwise_half
    result["band_low"], result["band_high"] = mean_diff - band_half, mean_diff + band_half
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
    """Coverage of :func:`analysis.aggregate.aggregate_curves`' mean and IQM intervals for normal data.

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
