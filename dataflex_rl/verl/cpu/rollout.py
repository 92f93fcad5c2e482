"""The ``dataflex_cpu`` rollout: verl's generation server on the CPU with the project's sampler."""

import asyncio
import dataclasses
import hashlib
import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from transformers import AutoModelForCausalLM
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput
from verl.workers.rollout.schemas import AsyncRolloutRequestStateEnum
from verl.workers.rollout.utils import ensure_async_iterator

from dataflex_rl.hashing import stable_hash
from dataflex_rl.tinylm.decoder import DecoderWeights, supported
from dataflex_rl.tinylm.sampler import sample
from dataflex_rl.tinylm.sequences import hf_sample, pad_rows

# Requests of one step arrive within milliseconds: wait this long after the first so they share a batch.
COLLECT_SECONDS = 0.05
# Sampling parameters the project's sampler does not implement, and the value that means "off".
PLAIN_SAMPLING = {"top_p": (1.0, None), "top_k": (-1, 0, None), "repetition_penalty": (1.0, None)}
# Hybrid: beside the trainer's workers (sync, colocate_async); standalone: in separate_async's rollout pool.
SERVED_MODES = (RolloutMode.HYBRID, RolloutMode.STANDALONE)


def server_name(replica_rank: int, suffix: str = "") -> str:
    return f"dataflex_cpu_rollout_{replica_rank}{suffix}"


def weights_digest(state: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over ``(name, float32 bytes)`` in name order: equal digests mean equal weights, bit for bit."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def request_seed(seed: int, version: int, prompt_ids: list[int], occurrence: int) -> int:
    """A 63-bit seed from the run seed, weights' version, prompt and its count of asks at this version."""
    payload = f"{seed}:{version}:{occurrence}:{','.join(map(str, prompt_ids))}"
    return int.from_bytes(bytes.fromhex(stable_hash(payload)), "little") >> 1


def check_sampling(sampling_params: dict[str, Any]) -> None:
    for key, allowed in PLAIN_SAMPLING.items():
        value = sampling_params.get(key)
        if value not in allowed:
            raise ValueError(f"actor_rollout_ref.rollout.{key} = {value!r} is not allowed with rollout.name="
                             f"dataflex_cpu: it samples from softmax(logits / temperature) only; allowed: "
                             f"{[v for v in allowed if v is not None]}")


@dataclasses.dataclass
class Request:
    prompt_ids: list[int]
    temperature: float
    max_tokens: int
    want_log_probs: bool
    seed: int
    future: asyncio.Future


def aborted_output(global_steps: int | None) -> TokenOutput:
    return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields={"global_steps": global_steps})


class CPURolloutServer:
    def __init__(self, config: Any, model_config: Any) -> None:
        # As verl's vLLM server does: the replica hands over DictConfigs, the server works on verl's dataclasses.
        self.config = config = omega_conf_to_dataclass(config)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        self.model = AutoModelForCausalLM.from_pretrained(model_config.local_path, dtype=torch.float32,
                                                          local_files_only=True).eval()
        # The project's KV-cached sampler where it covers the architecture exactly, else HF generate.
        self.cached = supported(self.model) is None
        self.weights = DecoderWeights(self.model) if self.cached else None
        tokenizer = model_config.tokenizer
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.pad_token_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id)
        self.seed = int(getattr(config, "seed", 0) or 0)
        self.global_steps: int | None = None
        self.version, self.occurrences, self.pending, self.rejecting = 0, Counter(), [], False
        self.batcher: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        self.running = asyncio.Event()  # cleared between abort_all_requests and resume_generation
        self.running.set()

    def max_tokens(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> int:
        """The response budget, as verl's vLLM server computes it."""
        budget = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
        if budget is None:
            budget = min(self.config.response_length,
                         self.config.prompt_length + self.config.response_length - len(prompt_ids))
        context = self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        return max(1, min(int(budget), int(context) - len(prompt_ids)))

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str,
                       **unused: Any) -> TokenOutput:
        check_sampling(sampling_params)
        if not self.running.is_set():
            if self.rejecting:
                return aborted_output(self.global_steps)
            await self.running.wait()
        prompt_ids = [int(token) for token in prompt_ids]
        key = (self.version, tuple(prompt_ids))
        self.occurrences[key] += 1
        request = Request(prompt_ids, float(sampling_params.get("temperature") or 0.0),
                          self.max_tokens(prompt_ids, sampling_params), bool(sampling_params.get("logprobs")),
                          request_seed(self.seed, self.version, prompt_ids, self.occurrences[key] - 1),
                          asyncio.get_running_loop().create_future())
        self.pending.append(request)
        if self.batcher is None or self.batcher.done():
            self.batcher = asyncio.get_running_loop().create_task(self.run_batches())
        return await request.future

    async def run_batches(self) -> None:
        while self.pending:
            await asyncio.sleep(COLLECT_SECONDS)
            batch, self.pending = self.pending, []
            groups: dict[tuple[float, int], list[Request]] = {}
            for request in batch:
                groups.setdefault((request.temperature, request.max_tokens), []).append(request)
            for group in groups.values():
                try:
                    async with self.lock:
                        outputs = await asyncio.to_thread(self.sample_batch, group)
                except Exception as error:  # every waiting caller gets the error, none hangs
                    for request in group:
                        request.future.set_exception(error)
                    continue
                for request, output in zip(group, outputs, strict=True):
                    request.future.set_result(output)

    def sample_batch(self, requests: list[Request]) -> list[TokenOutput]:
        prompt_ids, prompt_mask = pad_rows([request.prompt_ids for request in requests], self.pad_token_id, left=True)
        temperature = requests[0].temperature or None
        budget = requests[0].max_tokens
        if self.cached:
            generators = [torch.Generator().manual_seed(request.seed) for request in requests] if temperature else None
            responses, log_probs, _ = sample(self.weights, prompt_ids, prompt_mask, budget, temperature,
                                          self.eos_token_id, self.pad_token_id, row_generators=generators)
        else:  # HF generate draws the batch from one generator: seeded by the batch's requests
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(request_seed(self.seed, self.version, [r.seed for r in requests], 0))
                responses, log_probs, _ = hf_sample(self.model, prompt_ids, prompt_mask, budget, temperature,
                                                 self.eos_token_id, self.pad_token_id)
        outputs = []
        for row, request in enumerate(requests):
            tokens = responses[row].tolist()
            if self.eos_token_id in tokens:
                tokens = tokens[: tokens.index(self.eos_token_id) + 1]
            wanted = request.want_log_probs and log_probs is not None
            token_log_probs = log_probs[row, : len(tokens)].tolist() if wanted else None
            outputs.append(TokenOutput(token_ids=tokens, log_probs=token_log_probs, extra_fields={
                "global_steps": self.global_steps}, stop_reason=AsyncRolloutRequestStateEnum.COMPLETED.value))
        return outputs

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> str:
        async with self.lock:
            # In place: the sampler's DecoderWeights view these parameters, so it samples from the new weights.
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()
            if unexpected or set(missing) - tied:
                raise ValueError(f"weights sent to the rollout do not match its model: missing "
                                 f"{sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
            self.global_steps, self.version = global_steps, self.version + 1
            self.occurrences.clear()
            held = dict(self.model.state_dict())
            return weights_digest((name, held[name]) for name in state)

    async def abort_all_requests(self, reject_request: bool = False, **unused: Any) -> dict[str, Any]:
        """Pause: end the requests not yet in a sampler call ``aborted``."""
        self.running.clear()
        self.rejecting, waiting, self.pending = reject_request, self.pending, []
        for request in waiting:
            request.future.set_result(aborted_output(self.global_steps))
        return {"aborted_count": len(waiting), "request_ids": []}

    async def resume_generation(self, *args: Any, **kwargs: Any) -> None:
        self.rejecting = False
        self.running.set()


async def _nothing_to_do(*args: Any, **kwargs: Any) -> None:
    """What verl calls with nothing to do on the CPU (no device memory to free or fill, no profiler)."""


for _name in ("ready", "sleep", "wake_up", "clear_kv_cache", "release_kv_cache", "resume_kv_cache", "start_profile",
              "stop_profile"):
    setattr(CPURolloutServer, _name, _nothing_to_do)


class CPURolloutReplica(RolloutReplica):
    def rollout_worker_use_gpu(self) -> bool:  # the server needs no (logical) GPU
        return False

    async def launch_servers(self) -> None:
        if self.rollout_mode not in SERVED_MODES:
            raise NotImplementedError(f"rollout.name=dataflex_cpu serves verl's rollout modes {SERVED_MODES}; got "
                                      f"{self.rollout_mode}")
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        name = server_name(self.replica_rank, self.name_suffix)
        server = ray.remote(CPURolloutServer).options(
            name=name, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            max_concurrency=self.max_concurrency).remote(config=self.config, model_config=self.model_config)
        await server.ready.remote()
        self.servers, self._server_handle, self._server_address = [server], server, f"ray-actor:{name}"


class CPUServerAdapter(BaseRollout):
    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        replica_size = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                        * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // replica_size if replica_rank == -1 else replica_rank
        self.sends, self.server = rank % replica_size == 0, None

    resume = release = _nothing_to_do

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]], wire_format: str = "named_tensors",
                             **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"rollout.name=dataflex_cpu takes full named tensors, not {wire_format!r}")
        state = {name: tensor.detach().to("cpu", copy=True) async for name, tensor in ensure_async_iterator(weights)}
        if not self.sends:
            return
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        held = await self.server.update_weights.remote(state, kwargs.get("global_steps"))
        sent = weights_digest(state.items())
        if held != sent:
            raise RuntimeError(f"the rollout server's weights differ from the trainer's after the sync "
                               f"(digest {held[:12]} != {sent[:12]})")
