"""verl's ``cpu`` platform (``VERL_PLATFORM=cpu``): the device layer answered without an accelerator."""

from __future__ import annotations

import contextlib
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase

PLATFORM_NAME = "cpu"


def _host_memory() -> tuple[int, int]:
    page_size = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page_size, os.sysconf("SC_PHYS_PAGES") * page_size


def _nothing(*args: Any, **kwargs: Any) -> None:
    """A device call that has nothing to do on the CPU."""


def _zero(*args: Any, **kwargs: Any) -> int:
    """A device memory counter: the CPU has no separate device memory, so 0 bytes."""
    return 0


# The ``torch.cuda`` functions verl 0.9.1 calls through ``get_torch_device()``, answered on the CPU.
CPU_DEVICE_MODULE = SimpleNamespace(
    __name__="dataflex_rl.verl.cpu.device",
    is_available=lambda: True,
    device_count=lambda: 1,
    current_device=lambda: PLATFORM_NAME,
    set_device=_nothing,
    get_device_name=lambda *args: PLATFORM_NAME,
    synchronize=_nothing,
    empty_cache=_nothing,
    ipc_collect=_nothing,
    set_per_process_memory_fraction=_nothing,
    mem_get_info=lambda *args: _host_memory(),
    memory_allocated=_zero,
    memory_reserved=_zero,
    max_memory_allocated=_zero,
    max_memory_reserved=_zero,
    reset_peak_memory_stats=_nothing,
    manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed,
    get_rng_state=torch.get_rng_state,
    set_rng_state=torch.set_rng_state,
    Stream=torch.cpu.Stream,
    Event=torch.cpu.Event,
    current_stream=torch.cpu.current_stream,
    stream=torch.cpu.stream,
    memory=SimpleNamespace(_set_allocator_settings=_nothing),
)


class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    vendor_name = device_name

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE_MODULE  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu picks it, so a GPU machine keeps its accelerator.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        return PLATFORM_NAME

    def device_count(self) -> int:
        return 1

    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = _nothing

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for its logical GPUs; nothing on the CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
