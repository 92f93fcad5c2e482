"""The policy-loss route (``dataflex_rl.verl.policy_loss``): the rule inside verl's registered policy loss.

The route's weights are the mechanism's (one implementation), alpha = 0 is verl's base loss bit for bit, a
micro-batch normalises over its own tokens (by hand), verl's own ``ppo_loss`` runs it per micro-batch on a stub
worker, and what a loss cannot run is refused while verl builds its config, before any worker starts.
"""

from __future__ import annotations

import copy
import functools
import importlib.abc
import sys

import pytest
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig, PolicyLossConfig

from dataflex_rl import ConfigError, build_mechanism
from dataflex_rl.metrics import HISTOGRAM_EDGES
from dataflex_rl.verl.command import build_verl_command, experiment_environment, verl_overrides_of
from dataflex_rl.verl.config import LOSS_MODE, ROUTE_CONFIG_CLASS, validate_overrides
from dataflex_rl.verl.policy_loss import histogram_bins, pop_histograms
from dataflex_rl.verl.route_config import DataflexPolicyLossConfig

from tiny_actor import StubActorWorkerGroup, TinyLM, batch_of, grpo_advantages, make_rows, padded  # noqa: E402


CAPTURE = "dataflex_test_capture"


def block(alpha: float = 0.5, **changes) -> dict:
    return {"mechanism": "reweight", "scorer": {"name": "token_prob"},
            "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}}, **changes}


def actor_config(rule: dict, base: str = "vanilla", histograms: bool = False) -> ActorConfig:
    route = DataflexPolicyLossConfig(loss_mode=LOSS_MODE, dataflex=rule, base_loss_mode=base, histograms=histograms)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=route,
                       clip_ratio_low=0.2, clip_ratio_high=0.28)


def loss_inputs(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    old_log_prob = -3.0 * torch.rand(4, 6, generator=generator)
    response_mask = torch.ones(4, 6, dtype=torch.bool)
    response_mask[1, 4:] = False
    response_mask[3, 2:] = False
    return {"old_log_prob": old_log_prob, "response_mask": response_mask,
            "log_prob": old_log_prob + 0.1 * torch.randn(4, 6, generator=generator),
            "advantages": torch.randn(4, 6, generator=generator), "loss_agg_mode": "token-mean"}


def mechanism_fields(inputs: dict) -> dict:
    return {"old_log_probs": inputs["old_log_prob"], "response_mask": inputs["response_mask"],
            "advantages": inputs["advantages"]}


@pytest.fixture
def captured(monkeypatch):
    """A registered base loss that records the advantages the route hands it (the registry restored after)."""
    seen: list[torch.Tensor] = []

    def capture(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None):
        seen.append(advantages.detach().clone())
        return (log_prob * 0.0).sum(), {}

    monkeypatch.setitem(POLICY_LOSS_REGISTRY, CAPTURE, capture)
    return seen


def route_loss(rule: dict, inputs: dict, base: str = "vanilla", histograms: bool = False):
    return get_policy_loss_fn(LOSS_MODE)(**inputs, config=actor_config(rule, base, histograms))


def test_the_routes_weights_are_the_mechanisms_on_the_same_batch(captured):
    inputs = loss_inputs()
    _, metrics = route_loss(block(0.5), inputs, base=CAPTURE)
    expected = build_mechanism(block(0.5)).process(0, mechanism_fields(inputs))
    assert torch.equal(captured[0], expected.advantages)
    assert not torch.equal(expected.advantages, inputs["advantages"])  # the weights are off 1
    for name, value in expected.metrics.items():
        assert metrics[name] == value, name
    assert metrics["grad_norm/by_prob/low_prob_share"] > 0


@pytest.mark.parametrize("base", ["vanilla", "gspo", "cispo"])
def test_alpha_zero_is_the_base_loss_bit_for_bit(base):
    inputs = loss_inputs(1)
    config = actor_config(block(0.0), base)
    results = []
    for loss_fn in (get_policy_loss_fn(LOSS_MODE), get_policy_loss_fn(base)):
        log_prob = inputs["log_prob"].clone().requires_grad_()
        loss, metrics = loss_fn(**{**inputs, "log_prob": log_prob}, config=config)
        loss.backward()
        results.append((loss.detach(), log_prob.grad, metrics))
    (route, route_grad, route_metrics), (plain, plain_grad, plain_metrics) = results
    assert torch.equal(route, plain) and torch.equal(route_grad, plain_grad)
    assert {name: route_metrics[name] for name in plain_metrics} == plain_metrics
    assert route_metrics["dataflex/weight/std"] == 0.0


def test_a_micro_batch_normalises_over_its_own_tokens_by_hand(captured):
    """Two micro-batches, pi = [0.2, 0.6] and [1.0], AR alpha 0.5, every advantage 1: raw weights
    0.5 pi + 0.5 = [0.6, 0.8] and [1.0]. Over the batch the mean is (0.6 + 0.8 + 1.0) / 3 = 0.8, so the weights
    are [0.75, 1.0] and [1.25]; the route sees one micro-batch at a time, with means 0.7 and 1.0: [6/7, 8/7] and
    [1.0]. The first micro-batch's tokens get more weight, the last token less."""
    probabilities = torch.tensor([[0.2, 0.6], [1.0, 1.0]])
    mask = torch.tensor([[True, True], [True, False]])
    inputs = {"old_log_prob": probabilities.log(), "log_prob": probabilities.log(), "response_mask": mask,
              "advantages": torch.ones(2, 2), "loss_agg_mode": "token-mean"}
    for row in (0, 1):
        route_loss(block(0.5), {name: value[row:row + 1] if isinstance(value, torch.Tensor) else value
                                for name, value in inputs.items()}, base=CAPTURE)
    micro = torch.cat(captured)
    torch.testing.assert_close(micro[mask], torch.tensor([6 / 7, 8 / 7, 1.0]), rtol=1e-6, atol=0)
    batch = build_mechanism(block(0.5)).process(0, mechanism_fields(inputs)).advantages
    torch.testing.assert_close(batch[mask], torch.tensor([0.75, 1.0, 1.25]), rtol=1e-6, atol=0)


def test_verls_ppo_loss_runs_the_route_per_micro_batch_on_a_worker(compose_verl, kk_overrides):
    """verl's composed config with the route's overrides, built as its worker builds it, and verl's ``ppo_loss``
    on a stub worker (one mini-batch of two micro-batches of 4 rows): the gradient is the one of verl's vanilla
    loss on advantages the mechanism reweighted per micro-batch, not over the mini-batch."""
    config = compose_verl(kk_overrides(["dataflex.actuator.params.alpha=0.7"], ["trainer_mode=v0"]))
    OmegaConf.resolve(config)
    route_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(route_config.policy_loss, DataflexPolicyLossConfig)
    assert route_config.policy_loss.dataflex == OmegaConf.to_container(config.dataflex)
    plain_config = copy.deepcopy(route_config)
    object.__setattr__(plain_config, "policy_loss", PolicyLossConfig())

    policy = TinyLM(5)
    rows = make_rows(5, policy, TinyLM(55))
    advantages = grpo_advantages(rows)
    mechanism = build_mechanism(OmegaConf.to_container(config.dataflex))

    def reweighted(part: list[dict]) -> torch.Tensor:
        fields = {"old_log_probs": padded(part, "old"), "response_mask": padded(part, "mask") > 0,
                  "advantages": grpo_advantages(part)}
        return mechanism.process(0, fields).advantages

    per_micro_batch = torch.zeros_like(advantages)
    for part in (slice(0, 4), slice(4, 8)):
        weighted = reweighted(rows[part])
        per_micro_batch[part, :weighted.shape[1]] = weighted
    gradients = []
    for actor, batch_advantages in ((route_config, advantages), (plain_config, per_micro_batch),
                                    (plain_config, reweighted(rows))):
        worker = StubActorWorkerGroup(copy.deepcopy(policy), actor)
        worker.update_actor(batch_of(rows, batch_advantages, None))
        gradients.append(worker.calls[0]["grads"])
    route, micro, whole = gradients
    for ours, theirs in zip(route, micro, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    assert any(not torch.allclose(ours, theirs, rtol=1e-3) for ours, theirs in zip(route, whole, strict=True))


def test_histograms_travel_as_one_metric_per_bin():
    output = build_mechanism(block(0.5)).process(0, mechanism_fields(loss_inputs()), histograms=True)
    bins = histogram_bins(output.histograms)
    assert len(bins) == sum(len(HISTOGRAM_EDGES[name]) - 1 for name in output.histograms)
    rest = {**bins, "actor/pg_loss": 0.5}
    histograms = pop_histograms(rest)
    assert rest == {"actor/pg_loss": 0.5}
    for name, histogram in output.histograms.items():
        assert (histograms[name].counts == histogram.counts).all() and (histograms[name].edges == histogram.edges).all()


def test_the_loss_without_the_routes_config_says_what_to_add():
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         policy_loss=PolicyLossConfig(loss_mode=LOSS_MODE))
    with pytest.raises(ConfigError, match=r"needs the route's config class: add actor_rollout_ref\.actor\.policy_loss"
                                          r"\._target_=dataflex_rl\.verl\.route_config\.DataflexPolicyLossConfig"):
        get_policy_loss_fn(LOSS_MODE)(**loss_inputs(), config=config)


def route_node(rule: dict | None, **fields) -> DictConfig:
    return OmegaConf.create({"_target_": ROUTE_CONFIG_CLASS, "loss_mode": LOSS_MODE, "dataflex": rule, **fields})


@pytest.mark.parametrize(
    ("rule", "fields", "message"),
    [
        ({"mechanism": "isolate", "scorer": {"name": "token_prob"}, "actuator": {"name": "lopti"}}, {},
         r"dataflex\.mechanism = 'isolate' is not allowed with actor_rollout_ref\.actor\.policy_loss\.loss_mode="
         r"dataflex: its rule updates the policy once per stage.*trainer\.v1\.trainer_mode=dataflex_sync"),
        ({"mechanism": "reweight", "scorer": {"name": "entropy"}, "actuator": {"name": "entropy_quantile"}}, {},
         r"dataflex\.scorer\.name = 'entropy' is not allowed with .* it reads \['entropy'\], which verl does not "
         r"give a policy loss.*trainer\.v1\.trainer_mode=dataflex_sync"),
        (block(warmup_step=2), {}, r"dataflex\.warmup_step = 2 is not allowed with .*trainer_mode=dataflex_sync"),
        (block(), {"base_loss_mode": "dataflex"}, r"base_loss_mode = 'dataflex' is not allowed: .*'vanilla'"),
        (block(), {"base_loss_mode": "vanila"}, r"base_loss_mode = 'vanila' is not allowed: the loss under the rule"),
        (None, {}, r"policy_loss\.dataflex: missing"),
    ],
    ids=["staged", "entropy", "warmup", "itself-as-base", "unknown-base", "no-block"],
)
def test_verl_building_the_config_refuses_what_a_loss_cannot_run(rule, fields, message):
    # verl's driver builds the actor config in its validate_config, before Ray starts; each worker again.
    with pytest.raises(InstantiationException, match=message):
        omega_conf_to_dataclass(route_node(rule, **fields))


class BrokenImport(importlib.abc.MetaPathFinder):
    """Fails the import of ``name`` with ``reason``, as a broken install would."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def find_spec(self, name, path=None, target=None):
        if name == self.name:
            raise ImportError(self.reason)


def test_a_route_that_fails_to_import_stops_verls_config_with_the_reason(monkeypatch):
    """verl logs a plugin's import error at DEBUG only; the route's config class imports the route while verl builds
    its config (the driver's validate_config, before Ray starts), so the run stops there, with the reason."""
    import dataflex_rl.verl

    module = "dataflex_rl.verl.policy_loss"
    monkeypatch.delitem(sys.modules, module)
    monkeypatch.delattr(dataflex_rl.verl, "policy_loss")
    monkeypatch.setattr(sys, "meta_path", [BrokenImport(module, "torch 9 is not supported"), *sys.meta_path])
    with pytest.raises(InstantiationException, match=r"dataflex_rl\.verl\.policy_loss does not import: ImportError: "
                                                     r"torch 9 is not supported"):
        omega_conf_to_dataclass(route_node(block()))


CPU = ["prepared=/tmp/prepared"]


@functools.cache
def validated(extra: tuple[str, ...]):
    command = build_verl_command("verl_cpu_tiny", (), [*CPU, *extra])
    return validate_overrides(verl_overrides_of(command), experiment_environment("verl_cpu_tiny"))


@pytest.mark.parametrize("mode", ["v0", "sync"])
def test_the_command_builder_runs_the_route_in_verls_own_trainers(mode):
    command = build_verl_command("verl_cpu_tiny", (), [*CPU, f"trainer_mode={mode}"])
    assert command[2] == "verl.trainer.main_ppo"
    config, mechanism, place = validated((f"trainer_mode={mode}",))
    assert config.trainer.use_v1 == (mode == "sync") and config.trainer.v1.trainer_mode == "sync"
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == LOSS_MODE and place is None
    assert mechanism.config.actuator.params["alpha"] == 0.5
    recorded = build_verl_command("verl_cpu_tiny", (), [*CPU, f"trainer_mode={mode}", "+dataflex_run.dir=/tmp/r"])
    assert recorded[2] == "dataflex_rl.verl.record"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("trainer_mode=v0", "algorithm.rollout_correction.bypass_mode=true"),
         r"bypass_mode = True is not allowed with actor_rollout_ref\.actor\.policy_loss\.loss_mode=dataflex"),
        (("trainer_mode=sync", "+dataflex_stats.prob_change_every=1"),
         r"dataflex_stats\.prob_change_every = 1 is not allowed with .*loss_mode=dataflex"),
        (("actor_rollout_ref.actor.policy_loss.loss_mode=dataflex",),
         r"loss_mode = 'dataflex' is not allowed with trainer\.v1\.trainer_mode=dataflex_sync: that trainer "
         r"reweights the advantages already"),
        (("trainer.use_v1=false",), r"trainer\.use_v1 = False is not allowed without the policy-loss route"),
        (("trainer_mode=v0", "actor_rollout_ref.actor.policy_loss._target_=verl.workers.config.PolicyLossConfig"),
         r"policy_loss\._target_ = 'verl\.workers\.config\.PolicyLossConfig' is not allowed with .*loss_mode=dataflex"),
        (("trainer_mode=v0", "++actor_rollout_ref.actor.policy_loss.dataflex={actuator:{name:prob_band}}"),
         r"policy_loss\.dataflex is not allowed to differ from the run's dataflex block"),
    ],
    ids=["bypass", "prob-change", "both-routes", "legacy-without-route", "verls-config-class", "another-block"],
)
def test_a_route_command_verl_would_misrun_is_refused_before_launch(extra, message):
    with pytest.raises(ConfigError, match=message):
        validated(extra)
