"""The verl backend (verl 0.9.1, GPU clusters).

- :mod:`dataflex_rl.verl.trainer`: the ``dataflex_sync`` trainer, registered with verl's V1 trainer registry when
  the module is imported. verl imports it in every process that imports ``verl``: its ``__init__`` loads every
  entry point of the ``verl.plugins`` group, and ``pyproject.toml`` names this module there
  (``dataflex = "dataflex_rl.verl.trainer"``). So after ``pip install`` of the project,
  ``python -m verl.trainer.main_ppo trainer.v1.trainer_mode=dataflex_sync +dataflex.mechanism=reweight ...``
  works unchanged. verl swallows a plugin's import error (logged at DEBUG level); run the doctor, or set
  ``VERL_USE_EXTERNAL_MODULES=dataflex_rl.verl.trainer`` to have verl import it and fail loudly instead.
- :mod:`dataflex_rl.verl.command`: the ``python -m verl.trainer.main_ppo ...`` command line of an experiment file
  (``conf/verl_experiment/<name>.yaml``; does not import verl, so sweep drivers stay light).
- :mod:`dataflex_rl.verl.histograms`: mechanism histograms to verl's W&B run.
- :mod:`dataflex_rl.verl.loss`: verl's ``ppo_loss`` with per-stage KL and entropy terms, for staged mechanisms.
- :mod:`dataflex_rl.verl.run_record`: the project's run store, written by the trainer beside verl's loggers, and
  the W&B run's name, group, job type and tags from the same run identity as the local backend's.
- :mod:`dataflex_rl.verl.reward`: ``compute_score`` for ``reward.custom_reward_function``, any registered task with
  verl hooks (the row's ``data_source`` names it).
- :mod:`dataflex_rl.verl.data`: ``python -m dataflex_rl.verl.data``, a task's problems as verl parquet files.
- :mod:`dataflex_rl.verl.check`: ``python -m dataflex_rl.verl.check``, the doctor (versions, the plugin's import
  with its traceback, the entry point, a command's validation).

This package's ``__init__`` imports nothing heavy on purpose: importing :mod:`dataflex_rl.verl.command` must not
import verl's trainer stack.
"""
