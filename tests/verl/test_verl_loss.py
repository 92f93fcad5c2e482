"""The staged actor loss (verl's ``ppo_loss`` with per-stage KL and entropy), without Ray: the fast-tier twin of
``test_verl_transferqueue.py``, with the batch handed to the stub worker as a TensorDict instead of through
TransferQueue. Gradients are checked against the paper's actor loss restated in ``tiny_actor.py``."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from omegaconf import OmegaConf
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from dataflex_rl import ConfigError, build_mechanism
from dataflex_rl.verl.loss import staged_ppo_loss
from dataflex_rl.verl.config import mechanism_from_verl_config
from dataflex_rl.verl.trainer import DataflexSyncTrainer

# Sibling helper module (tests/verl is on sys.path under pytest's default import mode, as for conftest.py).
from tiny_actor import (
    ENTROPY_COEFF, StubActorWorkerGroup, TinyLM, batch_of, grpo_advantages, make_rows, padded, paper_gradient,
)

LOPTI = {"mechanism": "isolate", "scorer": {"name": "token_prob"},
         "actuator": {"name": "lopti", "params": {"eta": 0.5, "alpha": 0.3, "split": "quantile"}}}


def actor_config(verl_config):
    verl_config.actor_rollout_ref.actor.entropy_coeff = ENTROPY_COEFF
    return omega_conf_to_dataclass(verl_config.actor_rollout_ref.actor)


def stages_of(rows):
    fields = {"old_log_probs": padded(rows, "old"), "response_mask": padded(rows, "mask") > 0,
              "advantages": grpo_advantages(rows)}
    output = build_mechanism(LOPTI).process(1, fields)
    assert all(mask.any() for mask in output.stage_masks)  # the quantile split: half the tokens in each stage
    return output.advantages, output.stage_masks


def test_staged_updates_follow_the_papers_per_stage_kl_and_entropy(verl_config):
    config = actor_config(verl_config)
    policy, reference = TinyLM(11), TinyLM(111)
    rows = make_rows(11, policy, reference)
    advantages, stage_masks = stages_of(rows)
    worker = StubActorWorkerGroup(copy.deepcopy(policy), config)
    worker.set_loss_fn(functools.partial(staged_ppo_loss, config=config))
    for stage_mask in stage_masks:
        worker.update_actor(batch_of(rows, torch.where(stage_mask, advantages, 0.0), stage_mask))
    for call, stage_mask in zip(worker.calls, stage_masks, strict=True):
        stage_advantages = torch.where(stage_mask, advantages, 0.0)
        expected = paper_gradient(policy, call["params"], rows, stage_advantages, stage_mask, config)
        for ours, theirs in zip(call["grads"], expected, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        plain = paper_gradient(policy, call["params"], rows, stage_advantages, stage_mask, config,
                               mask_regularisers=False)
        assert max(float((ours - theirs).abs().max()) for ours, theirs in zip(call["grads"], plain)) > 1e-4


def test_the_stage_terms_add_up_to_one_full_kl_and_entropy_term(verl_config):
    """Summed over the two stages, the masked KL and entropy losses are the single-update ones (at equal params)."""
    config = actor_config(verl_config)
    policy, reference = TinyLM(12), TinyLM(112)
    rows = make_rows(12, policy, reference)
    advantages, stage_masks = stages_of(rows)
    worker = StubActorWorkerGroup(policy, config)
    data = batch_of(rows, advantages, None)
    tu.assign_non_tensor(data, batch_num_tokens=int(data["response_mask"].values().sum()), dp_size=1)
    with torch.no_grad():
        output = worker._forward(data)
        _, full = ppo_loss(config, output, data)
        staged = []
        for stage_mask in stage_masks:
            stage_data = batch_of(rows, advantages, stage_mask)
            tu.assign_non_tensor(stage_data, batch_num_tokens=int(data["response_mask"].values().sum()), dp_size=1)
            staged.append(staged_ppo_loss(config, output, stage_data)[1])
    for name in ("kl_loss", "actor/entropy_loss"):
        total = sum(metrics[name].aggregate() for metrics in staged)
        assert total == pytest.approx(full[name].aggregate(), rel=1e-5)
        assert all(0 < metrics[name].aggregate() < full[name].aggregate() for metrics in staged)


def test_without_the_stage_field_the_loss_is_verls(verl_config):
    config = actor_config(verl_config)
    policy, reference = TinyLM(13), TinyLM(113)
    rows = make_rows(13, policy, reference)
    data = batch_of(rows, grpo_advantages(rows), None)
    tu.assign_non_tensor(data, batch_num_tokens=int(data["response_mask"].values().sum()), dp_size=1)
    output = StubActorWorkerGroup(policy, config)._forward(data)
    ours, our_metrics = staged_ppo_loss(config, output, data)
    theirs, their_metrics = ppo_loss(config, output, data)
    assert torch.equal(ours, theirs)
    assert {name: metric.aggregate() if hasattr(metric, "aggregate") else metric
            for name, metric in our_metrics.items()} == {
        name: metric.aggregate() if hasattr(metric, "aggregate") else metric for name, metric in their_metrics.items()}


class RecordingLossGroup:
    def __init__(self) -> None:
        self.loss_functions = []

    def set_loss_fn(self, loss_fn) -> None:
        self.loss_functions.append(loss_fn)


def test_the_trainer_installs_the_staged_loss_built_from_the_actor_config(verl_config):
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex = LOPTI
    trainer = object.__new__(DataflexSyncTrainer)
    trainer.config = verl_config
    trainer.actor_rollout_wg = RecordingLossGroup()
    trainer.install_staged_loss()
    (installed,) = trainer.actor_rollout_wg.loss_functions
    assert installed.func is staged_ppo_loss
    config = installed.keywords["config"]
    # The experiment's KL loss settings, as verl's worker reads them from the same block.
    assert (config.use_kl_loss, config.kl_loss_coef, config.kl_loss_type, config.loss_agg_mode) == (
        True, 0.001, "low_var_kl", "token-mean")
    # set_loss_fn dispatches ONE_TO_ALL through Ray, which serialises the function with cloudpickle: it must arrive
    # whole and compute the same loss on the worker's side.
    import ray.cloudpickle

    arrived = ray.cloudpickle.loads(ray.cloudpickle.dumps(installed))
    policy, reference = TinyLM(14), TinyLM(114)
    rows = make_rows(14, policy, reference)
    advantages, stage_masks = stages_of(rows)
    data = batch_of(rows, torch.where(stage_masks[0], advantages, 0.0), stage_masks[0])
    tu.assign_non_tensor(data, batch_num_tokens=int(data["response_mask"].values().sum()), dp_size=1)
    output = StubActorWorkerGroup(policy, config)._forward(data)
    assert arrived.func is staged_ppo_loss
    assert torch.equal(arrived(model_output=output, data=data)[0], installed(model_output=output, data=data)[0])


def test_a_staged_mechanism_with_distillation_is_refused(verl_config):
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex = LOPTI
    verl_config.distillation = {"enabled": True}
    with pytest.raises(ConfigError, match="distillation.enabled = True is not allowed with dataflex.mechanism = "
                                          "'isolate'"):
        mechanism_from_verl_config(verl_config)
    verl_config.dataflex = {"mechanism": "reweight"}
    assert mechanism_from_verl_config(verl_config).config.mechanism == "reweight"
