"""Fixtures shared by the analysis tests: small fake sweeps written with :mod:`tests.analysis.synthetic`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analysis.synthetic import write_fake_sweep

ALPHAS = (0.0, 0.5, 1.0)
SEEDS = (1, 2, 3)


@pytest.fixture
def fake_sweep(tmp_path: Path) -> Path:
    """3 alphas x 3 seeds; (0.5, 2) failed, (1.0, 3) still running, (1.0, 1) pending (no folder)."""
    return write_fake_sweep(
        tmp_path / "sweep-a", alphas=ALPHAS, seeds=SEEDS, n_steps=30, failed=[(0.5, 2)], running=[(1.0, 3)],
        pending=[(1.0, 1)],
    )


@pytest.fixture
def complete_sweep(tmp_path: Path) -> Path:
    """3 alphas x 3 seeds, every run completed."""
    return write_fake_sweep(tmp_path / "sweep-b", alphas=ALPHAS, seeds=SEEDS, n_steps=30)
