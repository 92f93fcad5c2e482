"""Sweeps: the alpha x seed grid driver (``python -m sweeps``, ``make sweep``) and the Optuna search
(``python -m sweeps.tune``, ``make tune``).

Modules: :mod:`sweeps.config` (typed config), :mod:`sweeps.grid` (grid and run names), :mod:`sweeps.commands`
(command lines and their validation), :mod:`sweeps.backends` (one object per backend), :mod:`sweeps.launchers`
(a registry, one module per launcher: child processes here, SLURM, Ray Jobs), :mod:`sweeps.manifest`
(``sweep.json``), :mod:`sweeps.runner` (scheduling, resume, stop signals), :mod:`sweeps.session` (one invocation's
lock, record, warm start and exit code), :mod:`sweeps.summary` (tables, report), :mod:`sweeps.driver` (the grid
sweep), :mod:`sweeps.planning` (seed plans, estimates), :mod:`sweeps.tune` (the Optuna search).
"""
