"""Session-wide test environment: W&B sandboxed in a temp folder (nothing in $HOME, nothing online), Agg plots."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("WANDB_SILENT", "true")

WANDB_DIR_VARIABLES = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")


# The longest fast-tier modules, collected first: with one worker per core (make test) each starts right away on a
# worker of its own while the others work through the short modules, instead of starting last and running alone.
LONGEST_FIRST = ("tests/verl/test_verl_cpu_mode.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the :data:`LONGEST_FIRST` modules to the front (a stable sort: the order is otherwise kept)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))


@pytest.fixture(scope="session", autouse=True)
def wandb_sandbox(tmp_path_factory: pytest.TempPathFactory):
    """W&B reads its environment once per process (at its first setup), so the sandbox is set per session;
    subprocesses started by tests inherit it."""
    root = tmp_path_factory.mktemp("wandb_home")
    with pytest.MonkeyPatch.context() as patch:
        for variable in WANDB_DIR_VARIABLES:
            patch.setenv(variable, str(root / variable.lower()))
        patch.setenv("NETRC", str(root / "netrc"))  # no credentials: online mode must refuse politely
        patch.delenv("WANDB_API_KEY", raising=False)
        patch.delenv("WANDB_MODE", raising=False)
        # Restored at the end: the offline logger sets it when unset (no telemetry to the W&B server).
        patch.setenv("WANDB_ERROR_REPORTING", "false")
        yield root
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
