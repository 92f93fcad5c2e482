"""``python -m dataflex_rl.train [hydra overrides]``: one training run on the local CPU backend.

``python -m dataflex_rl.train --config-file PATH`` runs a resolved config instead (what the sweep driver launches:
it composed and validated each run's config once and wrote it to ``<sweep>/launch/<run>.yaml``); nothing is composed
again, and the same exit codes and refusals hold.

Public overrides: ``run_dir=PATH``, ``seed=N``, ``trainer.total_steps=N``, ``trainer.val_every=N``, ``sft.steps=N``,
``logger.wandb.mode=offline|online|disabled``, ``task=arithmetic|knights_knaves``, the ``dataflex.*`` block
(``dataflex.actuator.params.alpha=0.25``) and presets (``dataflex=baseline``). The same ``run_dir`` again resumes
from the last checkpoint; a completed run is left as it is. ``mode=sft`` only builds the cached SFT warm start.
Exit codes: 0 completed, 1 failed (``status.json`` has the traceback), 2 refused (nothing was touched): a bad
override or value, a config that differs from the one recorded in ``run_dir`` (the message names the keys), or
another process writing the same ``run_dir``; 130 interrupted. One process writes a run at a time: it holds the
run's lock (``<run_dir>/.run.lock``) for its whole life. ``trainer.total_steps`` may grow on resume (a completed
run is extended); the keys that cannot change the numbers (``logger.*``, ``threads``, ...) may differ.

The body is the local backend's (:mod:`dataflex_rl.local.cli`): the config is composed once (or read from the
file), validated once, and the console and ``<run_dir>/train.log`` get the same lines. This module keeps the public
command and its names (``run``, ``main``, ``CONF_DIR``, ``CONFIG_FILE_FLAG``) where scripts and tests import them.
"""

from dataflex_rl.local.cli import CONF_DIR, CONFIG_FILE_FLAG, main, run

__all__ = ["CONF_DIR", "CONFIG_FILE_FLAG", "main", "run"]

if __name__ == "__main__":
    main()
