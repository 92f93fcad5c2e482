"""The registrations and work-arounds that let verl 0.9.1's real V1 trainer run on a CPU, each naming its verl line.

Everything goes through verl's own extension points (its platform, engine and rollout registries) except two
module attributes verl binds at import, replaced in this process only:

1. ``PlatformRegistry.register("cpu")``: verl knows nvidia, huawei and amd (``plugin/platform/platform_manager.py``).
2. ``EngineRegistry.register(..., device="cpu")`` of the FSDP engines: verl registers them for cuda and npu only
   (``workers/engine/fsdp/transformer_impl.py`` L1143 and L1594).
3. ``engine_workers.initialize_global_process_group_ray``: ``utils/distributed.py`` L89 builds the backend
   ``"cpu:gloo,<device>:<backend>"``, on the CPU ``"cpu:gloo,cpu:gloo"``, which torch refuses (``Duplicate device
   type cpu``); the workers get ``"cpu:gloo"``.
4. ``transformer_impl.CPUOffloadPolicy``: L462 builds ``CPUOffloadPolicy(pin_memory=True)`` for a forward-only
   engine (the reference model); pinning needs an accelerator (``Cannot access accelerator device when none is
   available``), so the policy is built unpinned.
5. The rollout ``dataflex_cpu`` (:mod:`dataflex_rl.verl.cpu.rollout`) in ``RolloutReplicaRegistry`` and, for its
   in-worker adapter, ``_ROLLOUT_REGISTRY[("dataflex_cpu", "async")]`` (``workers/rollout/base.py`` L86-112).
6. The checkpoint engine ``dataflex_cpu`` (:mod:`dataflex_rl.verl.cpu.checkpoint`) in ``CheckpointEngineRegistry``:
   separate_async syncs its rollout pool through one, and verl's need accelerators or RDMA.
"""

from __future__ import annotations

import functools

ROLLOUT_NAME = "dataflex_cpu"
CPU_CHECKPOINT_ENGINE = "dataflex_cpu"  # the checkpoint engine's name (dataflex_rl.verl.cpu.checkpoint)
PROCESS_GROUP_BACKEND = "cpu:gloo"


def register_platform() -> None:
    """Work-around 1: the ``cpu`` platform (must come before anything imports ``transformer_impl``, which reads
    the device name at import, L89)."""
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from dataflex_rl.verl.cpu.platform import PLATFORM_NAME, PlatformCPU

    if PlatformRegistry.get(PLATFORM_NAME) is None:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def register_engines() -> None:
    """Work-around 2: the FSDP/FSDP2 language-model and value-model engines for device ``cpu``."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    from dataflex_rl.verl.cpu.platform import PLATFORM_NAME

    for model_type, engine in (("language_model", transformer_impl.FSDPEngineWithLMHead),
                               ("value_model", transformer_impl.FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        if all(PLATFORM_NAME in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            continue
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=PLATFORM_NAME)(engine)


def patch_process_group() -> None:
    """Work-around 3: the workers' process group on ``cpu:gloo`` alone."""
    from verl.utils import distributed
    from verl.workers import engine_workers

    engine_workers.initialize_global_process_group_ray = functools.partial(
        distributed.initialize_global_process_group_ray, backend=PROCESS_GROUP_BACKEND
    )


def patch_offload_policy() -> None:
    """Work-around 4: FSDP2's CPU offload policy of forward-only engines, unpinned."""
    from verl.workers.engine.fsdp import transformer_impl

    if getattr(transformer_impl.CPUOffloadPolicy, "dataflex_unpinned", False):
        return
    pinned_policy = transformer_impl.CPUOffloadPolicy

    class UnpinnedCPUOffloadPolicy(pinned_policy):
        """``CPUOffloadPolicy`` that never pins host memory (pinning needs an accelerator)."""

        dataflex_unpinned = True

        def __init__(self, pin_memory: bool = True) -> None:
            super().__init__(pin_memory=False)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def register_rollout() -> None:
    """Work-around 5: the ``dataflex_cpu`` rollout replica and its in-worker adapter."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    def load_replica():
        from dataflex_rl.verl.cpu.rollout import CPURolloutReplica

        return CPURolloutReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, load_replica)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "dataflex_rl.verl.cpu.rollout.CPUServerAdapter"


def register_checkpoint_engine() -> None:
    """Work-around 6: the ``dataflex_cpu`` checkpoint engine (weights through Ray's object store)."""
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from dataflex_rl.verl.cpu.checkpoint import CPUCheckpointEngine

    CheckpointEngineRegistry.register(CPU_CHECKPOINT_ENGINE)(CPUCheckpointEngine)


def apply_all() -> None:
    """Every registration and work-around above, in the order verl needs them (idempotent)."""
    register_platform()
    register_engines()
    patch_process_group()
    patch_offload_policy()
    register_rollout()
    register_checkpoint_engine()
