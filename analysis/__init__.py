"""Sweep analysis: run store or W&B -> long table -> aggregates with t intervals -> tables, figures, report.

``import analysis`` loads no pandas: the names below are imported when first asked for (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

_ON_DEMAND: dict[str, str] = {
    "curve_differences": "analysis.curves",
    "iqm_t_interval": "analysis.statistics",
    "plot_curve_difference": "analysis.plots",
    "plot_sample_efficiency": "analysis.plots",
}
__all__ = sorted(_ON_DEMAND)


def __getattr__(name: str) -> Any:
    if name not in _ON_DEMAND:
        raise AttributeError(f"module 'analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(_ON_DEMAND[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_DEMAND})
