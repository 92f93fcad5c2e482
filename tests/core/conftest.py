"""The ``device`` fixture: every device of :data:`tests.core.devices.DEVICES` (CUDA only where a GPU is present)."""

from __future__ import annotations

import pytest

from tests.core.devices import DEVICES


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param
