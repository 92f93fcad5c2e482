"""The ``dataflex_cpu`` checkpoint engine: separate_async's weight sync through Ray's object store."""

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
    """One sync's tensors, put by trainer rank 0 and read by every rollout worker."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.ready = asyncio.Event()

    async def put(self, state: dict[str, torch.Tensor]) -> None:
        self.state = state
        self.ready.set()

    async def get(self) -> dict[str, torch.Tensor]:
        await self.ready.wait()
        return self.state


class CPUCheckpointEngine(CheckpointEngine):
    # The trainer's handle of the current sync's mailbox: Ray ends an actor when its creator drops the last handle.
    current_mailbox: Any = None
    mailbox: Any = None

    def __init__(self, bucket_size: int, is_master: bool = False, **unused: Any) -> None:
        self.bucket_size, self.is_master = bucket_size, is_master

    def prepare(self) -> dict[str, Any]:  # no device buffers to allocate
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        name = f"dataflex_cpu_weights_{uuid.uuid4().hex[:12]}"
        cls.current_mailbox = WeightMailbox.options(name=name).remote()
        return {"mailbox": [name] * actor_wg_world_size}, {"mailbox": [name] * rollout_world_size}

    def init_process_group(self, mailbox: str) -> None:
        self.mailbox = ray.get_actor(mailbox)

    def finalize(self) -> None:
        """Trainer rank 0 ends the mailbox (every rollout worker has read it by now)."""
        if self.is_master and self.mailbox is not None:
            ray.kill(self.mailbox)
        self.mailbox = None

    async def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterator,
                           global_steps: int | None = None) -> dict:
        state = {name: tensor.detach().to("cpu", copy=True)
                 async for name, tensor in ensure_async_iterator(weights) if self.is_master}
        if self.is_master:
            await self.mailbox.put.remote(state)
        return {}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        for name, tensor in (await self.mailbox.get.remote()).items():
            yield name, tensor
