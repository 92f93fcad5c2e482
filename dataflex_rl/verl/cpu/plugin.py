"""Imported by verl in each process of the CPU mode: checks, then the registrations and work-arounds that let verl
0.9.1's V1 trainer run on a CPU, each naming what verl assumes of an accelerator."""

import functools
import importlib

from dataflex_rl.verl.cpu import (CHECKPOINT_ENGINE_NAME, PLATFORM, ROLLOUT_NAME, check_platform_selected,
                                  check_verl_version)


def register_platform() -> None:
    """First: transformer_impl reads the device when it is imported."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from dataflex_rl.verl.cpu.platform import PlatformCPU

    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(PlatformCPU)


def register() -> None:
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.utils import distributed
    from verl.workers import engine_workers
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from dataflex_rl.verl.cpu.checkpoint import CPUCheckpointEngine

    # verl registers its FSDP engines for cuda and npu only.
    for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                               ("value_model", transformer_impl.FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        if not all(PLATFORM in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM)(engine)
    # The workers' process group on cpu:gloo alone: verl asks for "cpu:gloo,cpu:gloo", which torch refuses.
    engine_workers.initialize_global_process_group_ray = functools.partial(
        distributed.initialize_global_process_group_ray, backend="cpu:gloo")
    # FSDP2's offload policy of the reference model unpinned: pinning memory needs an accelerator.
    if not getattr(transformer_impl.CPUOffloadPolicy, "dataflex_unpinned", False):
        class UnpinnedCPUOffloadPolicy(transformer_impl.CPUOffloadPolicy):
            dataflex_unpinned = True

            def __init__(self, pin_memory: bool = True) -> None:
                super().__init__(pin_memory=False)

        transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    # verl's rollouts are vLLM, SGLang and TRT-LLM servers, its checkpoint engines need accelerators or RDMA.
    RolloutReplicaRegistry.register(
        ROLLOUT_NAME, lambda: importlib.import_module("dataflex_rl.verl.cpu.rollout").CPURolloutReplica)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "dataflex_rl.verl.cpu.rollout.CPUServerAdapter"
    CheckpointEngineRegistry.register(CHECKPOINT_ENGINE_NAME)(CPUCheckpointEngine)


check_verl_version()
check_platform_selected()
register_platform()
register()
