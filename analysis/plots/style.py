"""Shared styling of the sweep figures: the palette, readable metric names, group labels and colours, EMA
smoothing, saving as PNG and PDF."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from analysis.groups import matching_rows
from dataflex_rl import keys


# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies. Only
# its colours with at least 3:1 contrast on white (WCAG 2.1 for graphics) are kept: blue, vermillion, bluish green,
# reddish purple, black; orange (2.2:1), sky blue (2.3:1) and yellow (1.3:1) are too pale. Paul Tol's dark wine and
# indigo follow for sweeps with more groups.
PALETTE: tuple[str, ...] = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#882255", "#332288")


# Readable names (with units) of the metrics the report draws; any other key is shown as it is.
METRIC_LABELS: dict[str, str] = {
    keys.VAL_ACCURACY: "Validation accuracy (fraction correct)",
    keys.SCORE_MEAN: "Mean reward per response",
    keys.TRAIN_ACCURACY: "Training accuracy (fraction correct)",
    keys.RESPONSE_LENGTH_MEAN: "Response length (tokens)",
    keys.TOKEN_PROB_LOW_FRAC: "Share of tokens with \u03c0 < 0.5",
    keys.TOKEN_PROB_MEAN: "Mean token probability \u03c0",
    keys.GRAD_NORM: "Gradient norm before clipping",
    keys.HIST_WEIGHT: "Advantage weight w",
    keys.HIST_TOKEN_PROB: "Token probability \u03c0",
}


STEP_LABEL = "RL step"


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def axes_or_new(ax: Axes | None) -> Axes:
    return ax if ax is not None else plt.subplots()[1]


def value_text(value: Any) -> str:
    """A factor's value as labels show it: ``0.5``, ``1e-05``, ``ar``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def group_label(group_keys: Sequence[str], values: Sequence[Any]) -> str:
    """``alpha=0.5`` or ``ar, alpha=0.5`` (a mechanism label is shown bare)."""
    texts = [value_text(value) for value in values]
    return ", ".join(text if key == "mechanism_label" else f"{key}={text}"
                     for key, text in zip(group_keys, texts, strict=True))


def group_colors(groups: Sequence[Any]) -> dict[Any, Any]:
    """One :data:`PALETTE` colour per group, in order (cycling)."""
    return {group: PALETTE[index % len(PALETTE)] for index, group in enumerate(groups)}


def ema(values: np.ndarray, smoothing: float) -> np.ndarray:
    """Debiased exponential moving average, as W&B and TensorBoard smooth curves; NaNs are skipped."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing!r} must be in [0, 1)")
    values = np.asarray(values, dtype=np.float64)
    # adjust=True debiases; ignore_na=True: a skipped value does not decay the weights and keeps the last mean
    finite = pd.Series(np.where(np.isfinite(values), values, np.nan))
    return finite.ewm(alpha=1.0 - smoothing, adjust=True, ignore_na=True).mean().to_numpy()


def save_figure(figure: Any, stem: str | Any, dpi: int = 200) -> list[Any]:
    """Write ``<stem>.png`` (``dpi``) and ``<stem>.pdf`` (vector); return both paths."""
    from pathlib import Path

    stem = Path(stem)
    paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".pdf")]
    figure.savefig(paths[0], dpi=dpi, bbox_inches="tight")
    figure.savefig(paths[1], bbox_inches="tight")
    return paths


def identical_metrics(long: pd.DataFrame, metrics: Sequence[str]) -> dict[str, str]:
    """``{metric: earlier metric}`` for each of ``metrics`` whose (run, step, value) rows equal an earlier one's."""
    series: dict[str, pd.Series] = {}
    duplicates: dict[str, str] = {}
    for metric in metrics:
        rows = long[long["metric"].astype(str) == metric]
        if rows.empty:
            continue
        values = rows.set_index([rows["run"].astype(str), rows["step"]])["value"].sort_index()
        same = next((name for name, other in series.items() if len(other) == len(values)
                     and other.index.equals(values.index) and np.allclose(other.to_numpy(), values.to_numpy())), None)
        if same is not None:
            duplicates[metric] = same
        else:
            series[metric] = values
    return duplicates


def sorted_groups(frame: pd.DataFrame, group_keys: Sequence[str]) -> list[tuple[Any, ...]]:
    unique = frame[list(group_keys)].drop_duplicates().sort_values(list(group_keys))
    return [tuple(row) for row in unique.itertuples(index=False)]


def group_color_map(frame: pd.DataFrame, group_keys: Sequence[str]) -> dict[tuple[Any, ...], Any]:
    """``{group: colour}`` as the per-group figures of the same rows colour them."""
    return group_colors(sorted_groups(frame, group_keys))


def group_rows(frame: pd.DataFrame, group_keys: Sequence[str], group: tuple[Any, ...]) -> pd.DataFrame:
    return frame[matching_rows(frame, dict(zip(group_keys, group, strict=True)))]


def close(ax_or_axes: Axes | np.ndarray | Mapping[str, Axes]) -> None:
    """Close the figure(s) behind axes made with ``ax=None`` (pyplot keeps them alive until closed)."""
    items = ax_or_axes.values() if isinstance(ax_or_axes, Mapping) else np.atleast_1d(ax_or_axes).ravel()
    for ax in items:
        plt.close(ax.figure)
