"""Sweeps: the grid driver (``python -m sweeps``, ``make sweep``) and the Optuna search (``python -m sweeps.tune``).
A sweep passes once through cli, config, grid, plan, runner (with launchers, manifest, live_view) and report."""
