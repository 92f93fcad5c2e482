"""Sweep analysis: run store or W&B -> long table -> aggregates with t intervals -> tables, figures, report.

Modules (imported on demand, so ``import analysis`` stays light): :mod:`analysis.load` (run stores, and the W&B
loaders of :mod:`analysis.wandb_runs` and :mod:`analysis.wandb_offline`, into the tables of :mod:`analysis.frames`),
:mod:`analysis.aggregate` (per-run summaries, per-group statistics, paired differences; on :mod:`analysis.statistics`,
:mod:`analysis.bootstrap` and :mod:`analysis.groups`), :mod:`analysis.curves` (sample-efficiency curves, and where in
training two groups differ: per-step paired differences against the baseline with a simultaneous band),
:mod:`analysis.power` (the report's power sections), :mod:`analysis.tables`, :mod:`analysis.plots`,
:mod:`analysis.report` (``python -m analysis.report runs/<sweep>``) with :mod:`analysis.warm_starts` (what the
intervals cover) and :mod:`analysis.environment` (the runs' numeric environments), :mod:`analysis.results` (the docs'
results files, ``make docs-results``), :mod:`analysis.export` and :mod:`analysis.synthetic` (synthetic run stores with
a known truth, for tests and benchmarks; writing one imports torch, as the run store records its numeric
environment). Nothing here imports a backend.

For notebooks, the curve comparisons are also reachable from the package itself, loaded on first use
(``from analysis import curve_differences``): :func:`~analysis.curves.curve_differences`,
:func:`~analysis.curves.simulate_band_coverage`, :func:`~analysis.curves.simulate_curve_interval_coverage`,
:func:`~analysis.statistics.iqm_t_interval`, :func:`~analysis.plots.plot_curve_difference` and
:func:`~analysis.plots.plot_sample_efficiency`.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module defining it; imported when first asked for (PEP 562), so ``import analysis`` loads no pandas
_ON_DEMAND: dict[str, str] = {
    "curve_differences": "analysis.curves",
    "simulate_band_coverage": "analysis.curves",
    "simulate_curve_interval_coverage": "analysis.curves",
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
