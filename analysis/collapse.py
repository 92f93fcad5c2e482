"""Collapse as an outcome: a run collapses when its metric falls at least ``margin`` below its own warm start (step 0)
and stays there to its end, over at least ``min_evaluations`` evaluations (:class:`CollapseRule`, the one place of the
rule and its defaults). Per group a rate with its exact (Clopper-Pearson) interval, each arm against the baseline
paired by seed with an exact McNemar test, and time to collapse as Kaplan-Meier curves (docs/analysis.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from analysis.groups import baseline_strata, group_items, group_key, group_text, matching_rows
from analysis.statistics import DEFAULT_CONFIDENCE, check_confidence
from dataflex_rl import keys

OUTCOME_COLUMNS = ("start", "end", "collapsed", "step", "judged")


@dataclasses.dataclass(frozen=True)
class CollapseRule:
    """A run collapsed at step ``t`` when every evaluation of ``metric`` from ``t`` to its last is at most its step-0
    value minus ``margin``, and there are at least ``min_evaluations`` of them; a run without a step-0 value is not
    judged. 0.05 is over three binomial standard errors of an accuracy near 0.1 on 1024 items."""

    metric: str = keys.VAL_ACCURACY
    margin: float = 0.05
    min_evaluations: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.margin, (int, float)) or isinstance(self.margin, bool) or not (
                math.isfinite(self.margin) and self.margin > 0):
            raise ValueError(f"collapse margin = {self.margin!r} is not allowed: it must be a finite number > 0")
        if isinstance(self.min_evaluations, bool) or not isinstance(self.min_evaluations, int) \
                or self.min_evaluations < 1:
            raise ValueError(f"collapse min_evaluations = {self.min_evaluations!r} is not allowed: it must be an "
                             f"integer >= 1")

    def describe(self) -> str:
        return (f"a run collapsed when its `{self.metric}` fell at least {self.margin:g} below its own value after "
                f"SFT (step 0) and stayed there to its last evaluation, over at least {self.min_evaluations} "
                f"evaluations; the collapse step is the first of them")


def run_outcome(steps: np.ndarray, values: np.ndarray, rule: CollapseRule) -> dict[str, Any]:
    """One run's :data:`OUTCOME_COLUMNS` from its evaluations (``steps`` increasing, non-finite values dropped)."""
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if not steps.size or steps[0] != 0:
        return {"start": np.nan, "end": values[-1] if values.size else np.nan, "collapsed": False,
                "step": steps[-1] if steps.size else np.nan, "judged": False}
    below = values <= values[0] - rule.margin
    tail = len(below) - (np.flatnonzero(~below)[-1] + 1)  # the trailing evaluations below the line
    collapsed = tail >= rule.min_evaluations
    return {"start": float(values[0]), "end": float(values[-1]), "collapsed": bool(collapsed),
            "step": int(steps[-tail] if collapsed else steps[-1]), "judged": True}


def collapse_outcomes(metrics: pd.DataFrame, rule: CollapseRule = CollapseRule(),
                      columns: Sequence[str] = ()) -> pd.DataFrame:
    """One row per run of the long table: ``run``, ``seed``, ``columns`` (group keys) and :data:`OUTCOME_COLUMNS`."""
    rows = metrics[metrics["metric"].astype(str) == rule.metric].sort_values(["run", "step"])
    identity = ["run", "seed", *(column for column in columns if column not in ("run", "seed"))]
    records = []
    for _, run in rows.groupby(rows["run"].astype(str), sort=True, observed=True):
        outcome = run_outcome(run["step"].to_numpy(dtype=np.int64), run["value"].to_numpy(dtype=np.float64), rule)
        records.append({**{column: run[column].iloc[0] for column in identity}, **outcome})
    return pd.DataFrame.from_records(records, columns=[*identity, *OUTCOME_COLUMNS])


def exact_rate(collapsed: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float]:
    """``(rate, low, high)``: the Clopper-Pearson interval of ``collapsed`` out of ``n``."""
    check_confidence(confidence)
    if n == 0:
        return np.nan, np.nan, np.nan
    interval = stats.binomtest(collapsed, n).proportion_ci(confidence, method="exact")
    return collapsed / n, float(interval.low), float(interval.high)


def mcnemar_exact(arm_only: int, baseline_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (the binomial test of one count at 1/2)."""
    discordant = arm_only + baseline_only
    return 1.0 if discordant == 0 else float(stats.binomtest(arm_only, discordant, 0.5).pvalue)


def collapse_table(outcomes: pd.DataFrame, group_keys: Sequence[str], baseline: Mapping[str, Any] | None,
                   confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Per group: judged runs, collapses, rate [exact interval]; against the baseline of its stratum, paired by seed:
    pairs, ``arm_only``/``baseline_only`` (the discordant pairs) and the exact McNemar p-value."""
    judged = outcomes[outcomes["judged"]]
    records = []
    strata_keys, baseline_keys = baseline_strata(judged, group_keys, baseline) if baseline else ([], {})
    for key, positions in group_items(judged, group_keys):
        group = judged.iloc[positions]
        collapsed = int(group["collapsed"].sum())
        rate, low, high = exact_rate(collapsed, len(group), confidence)
        record = {**dict(zip(group_keys, key, strict=True)), "runs": len(group), "collapsed": collapsed,
                  "rate": rate, "rate_low": low, "rate_high": high}
        stratum = group_key(key[list(group_keys).index(k)] for k in strata_keys)
        reference_key = baseline_keys.get(stratum) if baseline else None
        if reference_key is not None and group_key(key) != group_key(reference_key):
            reference = judged[matching_rows(judged, dict(zip(group_keys, reference_key, strict=True)))]
            pairs = group.merge(reference, on="seed", suffixes=("", "_baseline"))
            arm_only = int((pairs["collapsed"] & ~pairs["collapsed_baseline"]).sum())
            baseline_only = int((~pairs["collapsed"] & pairs["collapsed_baseline"]).sum())
            record.update(pairs=len(pairs), arm_only=arm_only, baseline_only=baseline_only,
                          p_mcnemar=mcnemar_exact(arm_only, baseline_only))
        records.append(record)
    return pd.DataFrame.from_records(records)


def survival_curves(outcomes: pd.DataFrame, group_keys: Sequence[str],
                    confidence: float = DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Kaplan-Meier share of runs not yet collapsed per group: ``step``, ``survival`` and its pointwise interval
    (log transform, statsmodels' ``SurvfuncRight``), a row at step 0 and one per collapse step."""
    from statsmodels.duration.survfunc import SurvfuncRight

    judged = outcomes[outcomes["judged"]]
    frames = []
    for key, positions in group_items(judged, group_keys):
        group = judged.iloc[positions]
        labels = dict(zip(group_keys, key, strict=True))
        curve = {"step": [0.0], "survival": [1.0], "low": [1.0], "high": [1.0]}
        if group["collapsed"].any():
            fit = SurvfuncRight(group["step"].to_numpy(dtype=np.float64), group["collapsed"].to_numpy(dtype=int))
            low, high = log_log_interval(fit.surv_prob, fit.surv_prob_se, confidence)
            curve = {"step": [0.0, *fit.surv_times], "survival": [1.0, *fit.surv_prob], "low": [1.0, *low],
                     "high": [1.0, *high]}
        frames.append(pd.DataFrame({**{name: value for name, value in labels.items()}, **curve,
                                    "group": group_text(labels)}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def log_log_interval(survival: np.ndarray, standard_error: np.ndarray,
                     confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Pointwise interval of a Kaplan-Meier value from Greenwood's standard error on the log(-log) scale
    (Kalbfleisch and Prentice): ``S ** exp(+-z se / (S |log S|))``; ``[0, 0]`` where ``S = 0``."""
    z = stats.norm.ppf(0.5 + confidence / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = z * standard_error / (survival * np.abs(np.log(survival)))
        low, high = survival ** np.exp(spread), survival ** np.exp(-spread)
    return np.where(survival > 0, low, 0.0), np.where(survival > 0, high, 0.0)
