"""verl's ``cpu`` platform (``VERL_PLATFORM=cpu``): the device layer answered without an accelerator."""

import contextlib
import os
from types import SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase

from dataflex_rl.verl.cpu import PLATFORM


def _nothing(*args: Any, **kwargs: Any) -> None:
    """A device call that has nothing to do on the CPU."""


def _host_memory(*args: Any) -> tuple[int, int]:
    page_size = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page_size, os.sysconf("SC_PHYS_PAGES") * page_size


# The ``torch.cuda`` functions verl 0.9.1 calls through ``get_torch_device()``, answered on the CPU: torch.cpu's
# (device, streams, synchronize), no-ops, and memory counters of 0 bytes, as the CPU has no separate device memory.
CPU_DEVICE_MODULE = SimpleNamespace(
    **{name: getattr(torch.cpu, name) for name in torch.cpu.__all__}, __name__="dataflex_rl.verl.cpu.device",
    get_device_name=lambda *args: PLATFORM, mem_get_info=_host_memory, manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed, get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
    memory=SimpleNamespace(_set_allocator_settings=_nothing),
    **dict.fromkeys(("empty_cache", "ipc_collect", "set_per_process_memory_fraction", "reset_peak_memory_stats"),
                    _nothing),
    **dict.fromkeys(("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"),
                    lambda *args, **kwargs: 0),
)


def _answer(value: Any) -> Any:
    """A platform method that returns ``value`` whatever it is asked."""
    return lambda self, *args, **kwargs: value


class PlatformCPU(PlatformBase):
    device_name = vendor_name = PLATFORM
    device_module = CPU_DEVICE_MODULE
    is_available = _answer(True)
    # Never auto-detected: only VERL_PLATFORM=cpu picks it, so a GPU machine keeps its accelerator.
    is_platform_available = _answer(False)
    current_device = _answer(PLATFORM)  # verl writes .to(get_device_id()): an int would mean cuda:N
    device_count = _answer(1)
    get_device_capability = _answer((None, None))
    communication_backend_name = _answer("gloo")
    # Ray sets CUDA_VISIBLE_DEVICES for its logical GPUs, which serve verl's GPU resource; nothing on the CPU reads it.
    visible_devices_envvar = _answer("CUDA_VISIBLE_DEVICES")
    ray_resource_name = _answer("GPU")
    is_ipc_supported = _answer(False)
    cudart = _answer(None)
    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = _nothing

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def nvtx_range(self, msg: str) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    def ray_noset_envvars(self) -> list[str]:
        return []
