"""The ``dataflex_cpu`` checkpoint engine: the trainer's weights to rollout replicas in another resource pool, on CPUs.

verl's separate_async trainer syncs a standalone rollout pool through a checkpoint engine other than ``naive``
(``trainer_separate_async.py`` L63 refuses ``naive``); verl 0.9.1's engines (NCCL, NIXL, HCCL, Mooncake, Kimi) need
accelerators or RDMA. This one goes through Ray's object store, with verl's ``CheckpointEngineManager`` driving it
as it drives NCCL's (``checkpoint_engine/base.py`` L513-560):

- ``build_topology`` (on the trainer) starts a :class:`WeightMailbox` Ray actor for this sync (holding its handle
  until the next sync) and names it to every worker; ``init_process_group`` looks it up.
- ``send_weights`` (every trainer rank: gathering a full FSDP tensor is a collective) copies each full tensor to the
  host; rank 0 puts the named tensors in the mailbox.
- ``receive_weights`` (each rollout worker) waits for them and yields them to the rollout's adapter
  (:class:`dataflex_rl.verl.cpu.rollout.CPUServerAdapter`), whose digest check covers this path too.
- ``finalize`` on trainer rank 0 ends the mailbox.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine
from verl.workers.rollout.utils import ensure_async_iterator

@ray.remote(num_cpus=0)
class WeightMailbox:
    """Holds one sync's named tensors until every rollout worker has read them."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None
        self.ready = asyncio.Event()

    async def put(self, state: dict[str, torch.Tensor]) -> None:
        """Store the trainer's weights and wake the readers."""
        self.state = state
        self.ready.set()

    async def get(self) -> dict[str, torch.Tensor]:
        """The weights, once the trainer has put them."""
        await self.ready.wait()
        assert self.state is not None
        return self.state


class CPUCheckpointEngine(CheckpointEngine):
    """verl's checkpoint-engine interface over a :class:`WeightMailbox` (see the module docstring)."""

    # The trainer's handle of the current sync's mailbox: Ray ends an actor when its creator drops the last handle.
    current_mailbox: Any = None

    def __init__(self, bucket_size: int, is_master: bool = False, **unused: Any) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.mailbox: Any = None

    def prepare(self) -> dict[str, Any]:
        """Nothing to allocate: no device buffers."""
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Start this sync's mailbox and hand its name to every worker of both sides."""
        name = f"dataflex_cpu_weights_{uuid.uuid4().hex[:12]}"
        cls.current_mailbox = WeightMailbox.options(name=name).remote()
        return {"mailbox": [name] * actor_wg_world_size}, {"mailbox": [name] * rollout_world_size}

    def init_process_group(self, mailbox: str) -> None:
        """Find the sync's mailbox."""
        self.mailbox = ray.get_actor(mailbox)

    def finalize(self) -> None:
        """Trainer rank 0 ends the mailbox (every rollout worker has read it by now)."""
        if self.is_master and self.mailbox is not None:
            ray.kill(self.mailbox)
        self.mailbox = None

    async def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterator,
                           global_steps: int | None = None) -> dict:
        """Every rank walks the tensors (a collective under FSDP); rank 0 sends host copies."""
        state = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.is_master:
                state[name] = tensor.detach().to("cpu", copy=True)
        if self.is_master:
            await self.mailbox.put.remote(state)
        return {}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        """The trainer's named tensors of this sync."""
        state = await self.mailbox.get.remote()
        for name, tensor in state.items():
            yield name, tensor
