"""Sweeps: the alpha x seed grid driver (``python -m sweeps``, ``make sweep``) and the Optuna search
(``python -m sweeps.tune``, ``make tune``).

Modules: :mod:`sweeps.config` (typed config), :mod:`sweeps.grid` (grid and run names), :mod:`sweeps.commands`
(command lines and their validation), :mod:`sweeps.launchers` (local processes, SLURM, Ray Jobs),
:mod:`sweeps.manifest` (``sweep.json``), :mod:`sweeps.driver` (scheduling, resume, summary), :mod:`sweeps.tune`.
"""
