"""Sweep analysis: run store or W&B -> long table -> aggregates with t intervals -> tables, figures, report.

Modules (imported on demand, so ``import analysis`` stays light): :mod:`analysis.load` (run stores, and the W&B
loaders of :mod:`analysis.wandb_runs` and :mod:`analysis.wandb_offline`, into the tables of :mod:`analysis.frames`),
:mod:`analysis.aggregate`, :mod:`analysis.power`, :mod:`analysis.tables`, :mod:`analysis.plots`,
:mod:`analysis.report` (``python -m analysis.report runs/<sweep>``), :mod:`analysis.export` and
:mod:`analysis.synthetic` (synthetic run stores with a known truth, for tests and benchmarks). Nothing here imports
torch or a backend.
"""
