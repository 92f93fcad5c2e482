"""Sweep analysis: run store or W&B -> long table -> aggregates with bootstrap CIs -> tables, figures, report.

Modules (imported on demand, so ``import analysis`` stays light): :mod:`analysis.load`, :mod:`analysis.aggregate`,
:mod:`analysis.tables`, :mod:`analysis.plots`, :mod:`analysis.report` (``python -m analysis.report runs/<sweep>``) and
:mod:`analysis.testing` (fake run stores for tests and benchmarks). Nothing here imports torch or a backend.
"""
