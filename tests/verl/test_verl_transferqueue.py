"""The verl data path against a real TransferQueue, on the CPU.

A real TransferQueue (``transfer_queue.init``: its controller and storage unit are Ray CPU actors, on loopback)
holds a batch shaped like verl's (jagged ``prompts``/``responses``/``input_ids``/``response_mask``/
``old_log_probs``/``ref_log_prob``/``rm_scores`` and a ``uid`` string per row, keys ``{uid}_{session}_{turn}``).
The ``dataflex_sync`` trainer runs verl's real ``_compute_advantage`` (GRPO) and the mechanism on it, then its
``_update_actor``. The actor worker group is a stub of verl's engine worker that keeps verl's own pieces: it reads
the batch back from TransferQueue through verl's ``tqbridge`` conversion (what every verl worker method does), splits
it with verl's ``make_iterator`` and ``chunk_tensordict``, sets verl's global batch info, and calls the loss function
the trainer installed (verl's real ``ppo_loss``, or the staged wrapper around it) on a tiny model's nested outputs.

What could not be real on a CPU, and why: verl 0.9.1's engine workers need a GPU (``FSDPEngine`` is registered for
``cuda``/``npu`` only, ``verl/workers/engine/fsdp/transformer_impl.py``; the resource pool asks Ray for GPUs), so the
model, optimiser and micro-batch loop are the stub's.

Each update's gradient is checked against a restatement of the paper's actor loss (``dp_actor.update_policy`` of
zhyang2226/AR-Lopti): dual-clip PPO on the stage's advantages, the entropy and ``low_var_kl`` terms multiplied by the
stage's mask (``kl_entropy_mask``), every term summed over tokens and divided by all response tokens of the
mini-batch. Slow: starting Ray and TransferQueue takes 10-40 s on a shared 2-core machine.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorStack

ray = pytest.importorskip("ray")
import transfer_queue as tq  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from dataflex_rl import build_mechanism, keys  # noqa: E402
from dataflex_rl.verl.loss import staged_ppo_loss  # noqa: E402
from dataflex_rl.verl.config import mechanism_from_verl_config  # noqa: E402
from dataflex_rl.verl.trainer import DataflexSyncTrainer  # noqa: E402

# Sibling helper module (tests/verl is on sys.path under pytest's default import mode, as for conftest.py).
from tiny_actor import (  # noqa: E402
    ENTROPY_COEFF, GROUP, PROMPTS, StubActorWorkerGroup, TinyLM, grpo_advantages, make_rows, nested, padded,
    paper_gradient,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_queue():
    """A local Ray (2 CPUs, no dashboard, loopback) with TransferQueue's controller and one storage unit.

    ``RAY_AUTH_MODE=disabled`` for the fixture's life: a local ``ray.init`` otherwise turns on Ray's token
    authentication, writes ``~/.ray/auth_token`` (which then switches it on for every later ``ray start`` of the
    user) and sets ``RAY_AUTH_MODE=token`` in this process for the tests that follow. Nothing listens beyond
    127.0.0.1.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(num_cpus=2, include_dashboard=False, address="local", _node_ip_address="127.0.0.1",
                     log_to_driver=False, configure_logging=False)
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        try:
            yield tq
        finally:
            tq.close()
            if started_ray:
                ray.shutdown()


def put_batch(rows: list[dict], partition: str) -> KVBatchMeta:
    """The rows into TransferQueue with verl's field names; returns verl's handle of the batch."""
    batch_keys = [f"{row['uid']}_{session}_0" for session, row in enumerate(rows)]
    scores = []
    for row in rows:
        score = torch.zeros(len(row["response"]))
        score[-1] = row["score"]
        scores.append(score)
    fields = TensorDict({
        "prompts": nested([row["prompt"] for row in rows]),
        "responses": nested([row["response"] for row in rows]),
        "input_ids": nested([torch.cat([row["prompt"], row["response"]]) for row in rows]),
        "response_mask": nested([row["mask"] for row in rows]),
        "rm_scores": nested(scores),
        "old_log_probs": nested([row["old"] for row in rows]),
        "ref_log_prob": nested([row["ref"] for row in rows]),
        "uid": NonTensorStack(*[row["uid"] for row in rows]),
    }, batch_size=len(rows))
    tq.kv_batch_put(keys=batch_keys, partition_id=partition, fields=fields)
    return KVBatchMeta(keys=batch_keys, tags=[{} for _ in batch_keys], partition_id=partition)



# --- the tests ------------------------------------------------------------------------------------------------------
def configured(verl_config, block: dict):
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex = block
    OmegaConf.set_struct(verl_config, True)
    actor = verl_config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = PROMPTS  # x rollout.n responses: the whole batch is one mini-batch
    actor.entropy_coeff = ENTROPY_COEFF  # the experiment has 0; on here, so the entropy mask is exercised
    verl_config.actor_rollout_ref.rollout.n = GROUP
    verl_config.actor_rollout_ref.rollout.temperature = 1.0
    return verl_config


def run_batch(verl_config, partition: str, seed: int):
    """Put a batch, run the trainer's advantage step and actor update on it; returns what the test checks."""
    policy, reference = TinyLM(seed), TinyLM(seed + 100)
    rows = make_rows(seed, policy, reference)
    batch = put_batch(rows, partition)
    trainer = object.__new__(DataflexSyncTrainer)
    trainer.config = verl_config
    trainer.mechanism = mechanism_from_verl_config(verl_config)
    trainer.histogram_logger, trainer.global_steps, trainer.timing_raw = None, 1, {}
    actor_config = omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)
    trainer.actor_rollout_wg = StubActorWorkerGroup(copy.deepcopy(policy), actor_config)
    if trainer.mechanism.config.mechanism == "isolate":
        trainer.install_staged_loss()  # what the trainer's _setup does for a staged mechanism
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics=metrics)
    trainer._update_actor(batch, metrics=metrics)
    stored = tq.kv_batch_get(keys=batch.keys, partition_id=partition, select_fields=["advantages"])
    tq.kv_clear(keys=batch.keys, partition_id=partition)
    return rows, policy, trainer, metrics, stored.to_padded_tensor()["advantages"], actor_config


def expected_advantages(rows, block) -> torch.Tensor:
    fields = {"old_log_probs": padded(rows, "old"), "response_mask": padded(rows, "mask") > 0,
              "advantages": grpo_advantages(rows)}
    return build_mechanism(block).process(1, fields)


def assert_gradients_close(actual, expected) -> None:
    for ours, theirs in zip(actual, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_advantage_reweighting_round_trip_and_update(real_queue, verl_config):
    block = {"mechanism": "reweight", "scorer": {"name": "token_prob"},
             "actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}}}
    rows, policy, trainer, metrics, stored, actor_config = run_batch(configured(verl_config, block), "ar", seed=3)
    expected = expected_advantages(rows, block)
    # verl's GRPO plus the mechanism, through TransferQueue and back: the workers read the reweighted advantages.
    torch.testing.assert_close(stored, expected.advantages, rtol=1e-6, atol=1e-6)
    calls = trainer.actor_rollout_wg.calls
    assert len(calls) == 1 and calls[0]["stage_mask"] is None
    torch.testing.assert_close(calls[0]["advantages"], expected.advantages, rtol=1e-6, atol=1e-6)
    # verl's ppo_loss over two micro-batches = the paper's loss over the mini-batch (all tokens are one stage).
    everything = padded(rows, "mask") > 0
    assert_gradients_close(calls[0]["grads"],
                           paper_gradient(policy, calls[0]["params"], rows, expected.advantages, everything,
                                          actor_config))
    assert metrics[keys.UPDATE_STAGES] == 1.0 and metrics[keys.ACTIVE] == 1.0
    assert metrics["actor/kl_loss"] > 0  # the reference model differs from the policy


@pytest.mark.parametrize("split, eta", [("threshold", 0.5), ("quantile", 0.3)])
def test_lopti_stages_round_trip_with_per_stage_kl_and_entropy(real_queue, verl_config, split, eta):
    block = {"mechanism": "isolate", "scorer": {"name": "token_prob"},
             "actuator": {"name": "lopti", "params": {"eta": eta, "alpha": 0.3, "split": split}}}
    rows, policy, trainer, metrics, stored, actor_config = run_batch(
        configured(verl_config, block), f"lopti-{split}", seed=5)
    expected = expected_advantages(rows, block)
    first, second = expected.stage_masks
    assert first.any() and second.any()
    calls = trainer.actor_rollout_wg.calls
    assert len(calls) == 2
    for call, stage_mask in zip(calls, (first, second), strict=True):
        # The stage's advantages and mask came back from TransferQueue to the worker.
        torch.testing.assert_close(call["advantages"], torch.where(stage_mask, expected.advantages, 0.0),
                                   rtol=1e-6, atol=1e-6)
        assert torch.equal(call["stage_mask"].bool(), stage_mask)
        # The staged loss (verl's ppo_loss + per-stage KL and entropy) = the paper's kl_entropy_mask loss ...
        stage_advantages = torch.where(stage_mask, expected.advantages, 0.0)
        assert_gradients_close(call["grads"], paper_gradient(policy, call["params"], rows, stage_advantages,
                                                             stage_mask, actor_config))
        # ... which is not verl's plain ppo_loss, whose KL and entropy cover every token in each stage.
        plain = paper_gradient(policy, call["params"], rows, stage_advantages, stage_mask, actor_config,
                               mask_regularisers=False)
        assert max(float((ours - theirs).abs().max()) for ours, theirs in zip(call["grads"], plain)) > 1e-4
    # The second stage started from the parameters the first one moved; old_log_probs stayed the sampler's.
    assert any(not torch.equal(calls[0]["params"][name], calls[1]["params"][name]) for name in calls[0]["params"])
    # The queue holds the full reweighted advantages again; each stage's metrics are reported on their own.
    torch.testing.assert_close(stored, expected.advantages, rtol=1e-6, atol=1e-6)
    assert metrics[keys.UPDATE_STAGES] == 2.0
    assert metrics["actor/kl_loss"] == pytest.approx(
        (metrics["actor/stage0/kl_loss"] + metrics["actor/stage1/kl_loss"]) / 2)
    assert math.isfinite(metrics[keys.LOPTI_THRESHOLD])


def test_staged_loss_without_a_stage_mask_is_verls_ppo_loss(real_queue, verl_config):
    """Outside a staged update (no stage field) the installed loss returns verl's own ppo_loss value."""
    block = {"mechanism": "isolate", "scorer": {"name": "token_prob"}, "actuator": {"name": "lopti"}}
    config = configured(verl_config, block)
    policy, reference = TinyLM(7), TinyLM(107)
    rows = make_rows(7, policy, reference)
    batch = put_batch(rows, "plain")
    tq.kv_batch_put(keys=batch.keys, partition_id="plain", fields=TensorDict(
        {"advantages": nested([torch.randn(len(row["mask"])) for row in rows])}, batch_size=len(rows)))
    data = tq.kv_batch_get(keys=batch.keys, partition_id="plain")
    tq.kv_clear(keys=batch.keys, partition_id="plain")
    tu.assign_non_tensor(data, batch_num_tokens=int(data["response_mask"].values().sum()), dp_size=1,
                         global_batch_size=len(rows), calculate_entropy=True)
    worker = StubActorWorkerGroup(policy, omega_conf_to_dataclass(config.actor_rollout_ref.actor))
    model_output = worker._forward(data)
    ours, _ = staged_ppo_loss(omega_conf_to_dataclass(config.actor_rollout_ref.actor), model_output, data)
    theirs, _ = ppo_loss(omega_conf_to_dataclass(config.actor_rollout_ref.actor), model_output, data)
    assert torch.equal(ours, theirs)
