"""The registrations and work-arounds that let verl 0.9.1's V1 trainer run on a CPU."""

from __future__ import annotations

import functools

ROLLOUT_NAME = "dataflex_cpu"
CPU_CHECKPOINT_ENGINE = "dataflex_cpu"  # the checkpoint engine's name (dataflex_rl.verl.cpu.checkpoint)
PROCESS_GROUP_BACKEND = "cpu:gloo"


def register_platform() -> None:
    """The ``cpu`` platform, before anything imports ``transformer_impl`` (it reads the device at import)."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from dataflex_rl.verl.cpu.platform import PLATFORM_NAME, PlatformCPU

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def register_engines() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    from dataflex_rl.verl.cpu.platform import PLATFORM_NAME

    for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                               ("value_model", transformer_impl.FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        if not all(PLATFORM_NAME in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(engine)


def patch_process_group() -> None:
    """Workers' process group on ``cpu:gloo`` alone (torch refuses ``"cpu:gloo,cpu:gloo"``)."""
    from verl.utils import distributed
    from verl.workers import engine_workers

    engine_workers.initialize_global_process_group_ray = functools.partial(
        distributed.initialize_global_process_group_ray, backend=PROCESS_GROUP_BACKEND
    )


def patch_offload_policy() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    if getattr(transformer_impl.CPUOffloadPolicy, "dataflex_unpinned", False):
        return

    class UnpinnedCPUOffloadPolicy(transformer_impl.CPUOffloadPolicy):
        dataflex_unpinned = True

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica():
        from dataflex_rl.verl.cpu.rollout import CPURolloutReplica

        return CPURolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "dataflex_rl.verl.cpu.rollout.CPUServerAdapter"


def register_checkpoint_engine() -> None:
    """The ``dataflex_cpu`` checkpoint engine (separate_async's weight sync; verl's need accelerators or RDMA)."""
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from dataflex_rl.verl.cpu.checkpoint import CPUCheckpointEngine

    CheckpointEngineRegistry.register(CPU_CHECKPOINT_ENGINE)(CPUCheckpointEngine)


def apply_all() -> None:
    register_platform()
    register_engines()
    patch_process_group()
    patch_offload_policy()
    register_rollout()
    register_checkpoint_engine()
