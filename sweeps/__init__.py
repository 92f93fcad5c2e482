"""Sweeps: the grid driver (``python -m sweeps``, ``make sweep``) and the Optuna search (``python -m sweeps.tune``,
``make tune``).

Modules, in the order a sweep passes through them: :mod:`sweeps.make` (``make sweep`` variables as data),
:mod:`sweeps.cli` (the command line, composed with Hydra), :mod:`sweeps.config` (the typed config; ``extra`` read
once into common overrides and typed axes), :mod:`sweeps.grid` (the axes, one :class:`~sweeps.grid.RunSpec` per
cell, run names), :mod:`sweeps.backends` and :mod:`sweeps.commands` (one object per backend; each run's config
composed once, or its verl command), :mod:`sweeps.driver` (one invocation: plan, session, summary),
:mod:`sweeps.runner` (scheduling, resume, stop signals), :mod:`sweeps.manifest` (``sweep.json``),
:mod:`sweeps.launchers` (a registry, one module per launcher: child processes here, SLURM, Ray Jobs),
:mod:`sweeps.progress` (the live view, the summary tables, the report). Clients of the driver:
:mod:`sweeps.planning` (seed plans, estimates) and :mod:`sweeps.tune` (the Optuna search).
"""
