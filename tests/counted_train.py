"""``python -m tests.counted_train <arguments>``: ``python -m dataflex_rl.local.train <arguments>`` with every composition
of ``conf/train.yaml`` counted.

Each composition appends one line ``<pid> <overrides>`` to the file named by ``$COMPOSE_COUNT_FILE``. The count
patches Hydra's composer itself (``Hydra.compose_config``), which both the compose API and ``hydra.main`` go
through, so no route to a composition is missed. A test counts the driver's own compositions by patching it with
:func:`counting` in its process, and the trainer's by running this module (as the sweep's ``train_module``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

COUNT_ENV = "COMPOSE_COUNT_FILE"


def counting(compose_config: Callable[..., Any], path: Path) -> Callable[..., Any]:
    """``compose_config`` (``Hydra.compose_config``) that first appends ``<pid> <overrides>`` to ``path`` when it
    composes ``conf/train.yaml``."""

    def counted(self, config_name, overrides, *args, **kwargs):
        if config_name == "train":
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{os.getpid()} {' '.join(overrides)}\n")
        return compose_config(self, config_name, overrides, *args, **kwargs)

    return counted


def compositions(path: Path) -> list[tuple[int, str]]:
    """``(pid, overrides)`` of every composition counted in ``path`` (none when it was never written)."""
    if not path.exists():
        return []
    pids_and_overrides = (line.split(" ", 1) for line in path.read_text(encoding="utf-8").splitlines())
    return [(int(pid), rest[0] if rest else "") for pid, *rest in pids_and_overrides]


if __name__ == "__main__":
    from hydra._internal.hydra import Hydra

    Hydra.compose_config = counting(Hydra.compose_config, Path(os.environ[COUNT_ENV]))
    from dataflex_rl.local.train import main

    sys.exit(main())
