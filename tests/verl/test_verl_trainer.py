"""The ``dataflex_sync`` trainer: config validation at build time, and the ``_compute_advantage`` override.

``_compute_advantage`` runs verl's own advantage code (GRPO, rollout correction) and then the mechanism, against an
in-memory TransferQueue (see ``conftest.py``); verl's unmodified sync trainer on an identical queue gives the
advantages and ``rollout_is_weights`` the mechanism must start from.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, get_trainer_cls
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.trainer.ppo.v1.utils import MetricsAggregator

from dataflex_rl import ConfigError, build_mechanism, keys
from dataflex_rl.verl.config import DEFAULT_TRAINER_MODE as TRAINER_NAME, mechanism_from_verl_config, prob_change_every
from dataflex_rl.verl.loss import STAGE_MASK_FIELD
from dataflex_rl.verl.policy_loss import pop_histograms
from dataflex_rl.verl.trainer import (BASE_ADVANTAGES_FIELD, HISTOGRAM_BIN_INFIX, MECHANISM_TIMER, STAGE_FIELD,
                                      DataflexSyncTrainer, WandbHistogramLogger)

PARTITION = "train"


def dataflex_block(alpha: float = 0.5, warmup_step: int = 0) -> dict:
    return {
        "mechanism": "reweight",
        "scorer": {"name": "token_prob", "params": {}},
        "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha, "normalize": "mean"}},
        "warmup_step": warmup_step,
    }


def set_dataflex(config, block) -> None:
    OmegaConf.set_struct(config, False)
    config.dataflex = block
    OmegaConf.set_struct(config, True)


def fill_queue(queue, rows: list[dict], *, with_rollout_log_probs: bool) -> KVBatchMeta:
    """One row per response: ``uid``, ``response_mask``, ``rm_scores`` (score on the last token), log-probs.

    Keys follow verl's ``{uid}_{session}_{turn}``; every response is one session of one turn.
    """
    keys_in_order = []
    for session, row in enumerate(rows):
        key = f"{row['uid']}_{session}_0"
        mask = torch.tensor(row["mask"], dtype=torch.int64)
        scores = torch.zeros(len(row["mask"]), dtype=torch.float32)
        scores[-1] = row["score"]
        fields = {
            "uid": row["uid"],
            "response_mask": mask,
            "rm_scores": scores,
            "old_log_probs": torch.tensor(row["old_log_probs"], dtype=torch.float32),
        }
        if with_rollout_log_probs:
            fields["rollout_log_probs"] = torch.tensor(row["rollout_log_probs"], dtype=torch.float32)
        if "entropy" in row:  # what verl's _compute_old_log_prob writes next to old_log_probs
            fields["entropy"] = torch.tensor(row["entropy"], dtype=torch.float32)
        queue.add(PARTITION, key, **fields)
        keys_in_order.append(key)
    return KVBatchMeta(keys=keys_in_order, tags=[{} for _ in keys_in_order], partition_id=PARTITION)


def random_rows(seed: int, prompts: int, group: int) -> list[dict]:
    """``prompts`` groups of ``group`` responses with varied lengths, a masked (tool) token, rewards 0/1."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for prompt in range(prompts):
        for _ in range(group):
            length = int(torch.randint(2, 9, (), generator=generator))
            mask = [1] * length
            if length > 4:
                mask[2] = 0  # a token the policy did not generate (e.g. a tool response)
            old = -torch.rand(length, generator=generator) * 3.0
            rollout = old + (torch.rand(length, generator=generator) - 0.5) * 0.4
            rows.append(
                {
                    "uid": f"p{prompt}",
                    "mask": mask,
                    "score": float(torch.randint(0, 2, (), generator=generator)),
                    "old_log_probs": old.tolist(),
                    "rollout_log_probs": rollout.tolist(),
                }
            )
    return rows


def stub_trainer(config, global_steps: int, histogram_logger=None) -> DataflexSyncTrainer:
    """The trainer without ``__init__`` (no workers): only what ``_compute_advantage`` reads."""
    trainer = object.__new__(DataflexSyncTrainer)
    trainer.config = config
    trainer.mechanism = mechanism_from_verl_config(config)
    trainer.histogram_logger = histogram_logger
    trainer.global_steps = global_steps
    trainer.timing_raw = {}
    return trainer


def stub_verl_trainer(config) -> PPOTrainerSync:
    trainer = object.__new__(PPOTrainerSync)
    trainer.config = config
    return trainer


def padded(queue, batch: KVBatchMeta, field: str) -> torch.Tensor:
    return queue.kv_batch_get(batch.keys, batch.partition_id, [field]).to_padded_tensor()[field]


def run_both(verl_config, rows, *, global_steps, with_rollout_log_probs, queues):
    """The same rows through the dataflex trainer and through verl's sync trainer, each on its own queue.

    Returns (dataflex queue, verl queue, batch, the dataflex trainer's metrics, the dataflex trainer).
    """
    ours = queues.new()
    batch = fill_queue(ours, rows, with_rollout_log_probs=with_rollout_log_probs)
    metrics: dict = {}
    trainer = stub_trainer(verl_config, global_steps)
    returned = trainer._compute_advantage(batch, metrics=metrics)
    assert returned.keys == batch.keys

    theirs = queues.new()
    fill_queue(theirs, rows, with_rollout_log_probs=with_rollout_log_probs)
    stub_verl_trainer(verl_config)._compute_advantage(batch, metrics={})
    return ours, theirs, batch, metrics, trainer


# --- build time -----------------------------------------------------------------------------------------------------
def test_registered_under_its_name():
    assert get_trainer_cls(TRAINER_NAME) is DataflexSyncTrainer
    assert issubclass(DataflexSyncTrainer, PPOTrainerSync)


def test_builds_on_the_composed_experiment_config_as_the_sync_trainer(verl_config):
    trainer = DataflexSyncTrainer(config=verl_config)
    # verl's base class picks the sync replay buffer only when it sees trainer_mode == "sync".
    assert isinstance(trainer.replay_buffer, ReplayBuffer)
    assert trainer.trainer_mode == "sync"
    assert verl_config.trainer.v1.trainer_mode == TRAINER_NAME
    assert trainer.parameter_sync_step == 1
    assert trainer.mechanism.config.actuator.params["alpha"] == 0.2  # the experiment's default
    assert isinstance(trainer.histogram_logger, WandbHistogramLogger)  # trainer.logger holds wandb


def test_no_histogram_logger_without_wandb(verl_config):
    verl_config.trainer.logger = ["console"]
    assert DataflexSyncTrainer(config=verl_config).histogram_logger is None


@pytest.mark.parametrize(
    "change",
    [
        {"actuator": {"name": "advantage_reweight", "params": {"alpha": 1.5}}},
        {"actuator": {"name": "no_such_actuator"}},
        {"scorer": {"name": "token_prob", "params": {"temperature": 2}}},
        {"warmup_step": -1},
        {"mechanism": "no_such_mechanism"},
    ],
    ids=["alpha-out-of-range", "unknown-actuator", "unknown-param", "negative-warmup", "unknown-mechanism"],
)
def test_bad_dataflex_block_fails_at_build_with_the_local_backends_message(verl_config, change):
    block = {**dataflex_block(), **change}
    with pytest.raises(ConfigError) as local_error:
        build_mechanism(block)
    set_dataflex(verl_config, block)
    with pytest.raises(ConfigError) as verl_error:
        DataflexSyncTrainer(config=verl_config)
    assert str(verl_error.value) == str(local_error.value)
    assert not hasattr(verl_error.value, "__notes__")


def test_missing_dataflex_block_fails_at_build(verl_config):
    OmegaConf.set_struct(verl_config, False)
    del verl_config["dataflex"]
    with pytest.raises(ConfigError, match=r"dataflex: missing.*\+dataflex\.mechanism=reweight"):
        DataflexSyncTrainer(config=verl_config)


# --- _compute_advantage ---------------------------------------------------------------------------------------------
def test_hand_derived_reweighted_grpo_advantages(verl_config, queues):
    queue = queues.new()
    """One prompt, two responses: rewards 1 and 0, token probabilities (0.5, 1.0) and (0.25,), alpha = 0.5."""
    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 2
    rows = [
        {"uid": "p0", "mask": [1, 1], "score": 1.0, "old_log_probs": [math.log(0.5), 0.0]},
        {"uid": "p0", "mask": [1], "score": 0.0, "old_log_probs": [math.log(0.25)]},
    ]
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    metrics: dict = {}
    stub_trainer(verl_config, global_steps=1)._compute_advantage(batch, metrics=metrics)

    # GRPO: (score - mean) / (std + 1e-6) with mean 0.5 and the unbiased std of (1, 0), sqrt(0.5).
    grpo = 0.5 / (math.sqrt(0.5) + 1e-6)
    # w = 0.5 * pi + 0.5 -> (0.75, 1.0, 0.625), divided by their mean 2.375 / 3.
    mean_weight = (0.75 + 1.0 + 0.625) / 3
    first = queue.row(PARTITION, batch.keys[0])["advantages"]
    second = queue.row(PARTITION, batch.keys[1])["advantages"]
    torch.testing.assert_close(first, torch.tensor([grpo * 0.75, grpo * 1.0]) / mean_weight)
    torch.testing.assert_close(second, torch.tensor([-grpo * 0.625]) / mean_weight)
    assert metrics[keys.ACTIVE] == 1.0
    assert metrics[keys.VALID_TOKENS] == 3.0
    assert metrics[keys.WEIGHT_KEYS[0]] == pytest.approx(1.0)  # dataflex/weight/mean: normalised over the batch
    assert metrics[keys.TOKEN_PROB_MEAN] == pytest.approx((0.5 + 1.0 + 0.25) / 3)


def test_equals_the_mechanism_on_the_whole_batch_and_keeps_rollout_is_weights(verl_config, queues):
    set_dataflex(verl_config, dataflex_block(alpha=0.7))
    verl_config.actor_rollout_ref.rollout.n = 4
    verl_config.algorithm.rollout_correction.rollout_is = "token"  # verl writes rollout_is_weights
    rows = random_rows(seed=3, prompts=3, group=4)
    queue, verl_queue, batch, metrics, trainer = run_both(
        verl_config, rows, global_steps=5, with_rollout_log_probs=True, queues=queues
    )

    fields = {name: padded(verl_queue, batch, name) for name in ("old_log_probs", "response_mask", "advantages")}
    assert fields["advantages"].abs().sum() > 0  # some groups have mixed rewards
    expected, expected_metrics = build_mechanism(dataflex_block(alpha=0.7)).apply(5, fields)
    assert torch.equal(padded(queue, batch, "advantages"), expected)
    assert not torch.equal(expected, fields["advantages"])
    for key, value in expected_metrics.items():
        assert metrics[key] == pytest.approx(value)

    # verl's importance weights are left exactly as verl wrote them (they multiply in at the loss).
    is_weights = padded(queue, batch, "rollout_is_weights")
    assert torch.equal(is_weights, padded(verl_queue, batch, "rollout_is_weights"))
    valid = fields["response_mask"].bool()
    assert not torch.allclose(is_weights[valid], torch.ones_like(is_weights[valid]))
    assert "rollout_is_weights" not in queue.puts[-1] and queue.puts[-1] == ("advantages",)
    assert MECHANISM_TIMER in trainer.timing_raw
    assert any(key.startswith("rollout_corr/") for key in metrics)  # verl's own step ran first


def test_gradient_statistics_by_probability_bucket(verl_config, queues):
    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=7, prompts=2, group=4)
    queue, _, batch, metrics, _ = run_both(
        verl_config, rows, global_steps=1, with_rollout_log_probs=False, queues=queues
    )
    labels = [keys.bucket_label(low, high) for low, high in ((0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))]
    shares = [metrics[keys.grad_by_prob(label, "token_share")] for label in labels]
    assert sum(shares) == pytest.approx(1.0)
    # Recompute one bucket by hand: mean over its tokens of |A w| (1 - pi).
    mask = padded(queue, batch, "response_mask").bool()
    probs = padded(queue, batch, "old_log_probs").exp()[mask]
    magnitude = padded(queue, batch, "advantages")[mask].abs()
    low_bucket = probs < 0.25
    assert low_bucket.any()
    expected = float((magnitude[low_bucket] * (1 - probs[low_bucket])).mean())
    assert metrics[keys.grad_by_prob(labels[0], "logit_grad_bound")] == pytest.approx(expected, rel=1e-5)


def test_warmup_counts_verl_global_steps(verl_config, queues):
    set_dataflex(verl_config, dataflex_block(alpha=1.0, warmup_step=3))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=11, prompts=2, group=4)
    queue, verl_queue, batch, metrics, _ = run_both(
        verl_config, rows, global_steps=2, with_rollout_log_probs=False, queues=queues
    )
    assert torch.equal(padded(queue, batch, "advantages"), padded(verl_queue, batch, "advantages"))
    assert metrics[keys.ACTIVE] == 0.0

    queue, verl_queue, batch, metrics, _ = run_both(
        verl_config, rows, global_steps=3, with_rollout_log_probs=False, queues=queues
    )
    assert not torch.equal(padded(queue, batch, "advantages"), padded(verl_queue, batch, "advantages"))
    assert metrics[keys.ACTIVE] == 1.0


def test_histograms_go_to_the_wandb_run_at_the_global_step(verl_config, queues, monkeypatch):
    queue = queues.new()
    import wandb

    logged = []
    run = SimpleNamespace(id="run-1", tags=("sweep-a",))
    monkeypatch.setattr(wandb, "run", run)
    monkeypatch.setattr(wandb, "log", lambda payload, step: logged.append((step, payload)))
    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=5, prompts=2, group=4)
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    trainer = stub_trainer(verl_config, global_steps=9, histogram_logger=WandbHistogramLogger("reweight"))
    trainer._compute_advantage(batch, metrics={})

    assert len(logged) == 1
    step, payload = logged[0]
    assert step == 9
    assert set(payload) == {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB}
    valid_tokens = sum(sum(row["mask"]) for row in rows)
    for histogram in payload.values():
        assert isinstance(histogram, wandb.Histogram)
        assert sum(histogram.histogram) == valid_tokens
        assert len(histogram.bins) == len(histogram.histogram) + 1
    assert np.isclose(payload[keys.HIST_TOKEN_PROB].bins[-1], 1.0)
    assert run.tags == ("sweep-a", "verl", "reweight")


def test_the_run_stores_histograms_add_up_over_a_steps_sub_batches(verl_config, queues, monkeypatch):
    """separate_async runs the advantage step once per mini-batch: the bins ride in each one's metrics, verl's
    MetricsAggregator sums them, and _compute_metrics takes them out for the run store before verl logs."""
    monkeypatch.setattr(PPOTrainer, "_compute_metrics", lambda *args, **kwargs: None)
    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    logged = []
    trainer = stub_trainer(verl_config, global_steps=1)
    trainer.run_record = SimpleNamespace(log_step=lambda *args: logged.append(args))
    aggregator, expected = MetricsAggregator(), {}
    for seed in (1, 2):
        rows = random_rows(seed=seed, prompts=2, group=4)
        metrics: dict = {}
        trainer._compute_advantage(fill_queue(queues.new(), rows, with_rollout_log_probs=False), metrics=metrics)
        aggregator.add_step_metrics(metrics, sample_count=len(rows))
        for name, histogram in pop_histograms(dict(metrics), HISTOGRAM_BIN_INFIX).items():
            expected[name] = expected.get(name, 0) + histogram.counts
    step_metrics = aggregator.get_aggregated_metrics()
    trainer._compute_metrics(None, step_metrics, {}, global_steps=1, epoch=0)
    [(step, metrics, histograms)] = logged
    assert step == 1 and set(histograms) == set(expected) == {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB}
    for name, counts in expected.items():
        assert (histograms[name].counts == counts).all()
    assert metrics is step_metrics and not any(name.startswith("dataflex/hist/") for name in metrics)


# --- staged updates (Lopti) -----------------------------------------------------------------------------------------
def lopti_block(eta: float = 0.5, alpha: float = 0.0, warmup_step: int = 0) -> dict:
    return {
        "mechanism": "isolate",
        "scorer": {"name": "token_prob", "params": {}},
        "actuator": {"name": "lopti", "params": {"eta": eta, "alpha": alpha, "normalize": "mean"}},
        "warmup_step": warmup_step,
    }


class RecordingActorGroup:
    """Stands in for verl's actor worker group: records the advantages in the queue at each ``update_actor`` call
    and answers with actor metrics that differ per call (``pg_loss`` = the call's index)."""

    def __init__(self, queues) -> None:
        self.queues = queues
        self.seen_advantages: list[torch.Tensor] = []
        self.seen_stage_masks: list[torch.Tensor | None] = []

    def update_actor(self, batch: KVBatchMeta) -> dict:
        self.seen_advantages.append(padded(self.queues.current, batch, "advantages"))
        # The workers read the fields the handle lists (verl's kv_batch_meta2batch_meta selects meta.fields).
        listed = batch.fields is not None and STAGE_MASK_FIELD in batch.fields
        self.seen_stage_masks.append(padded(self.queues.current, batch, STAGE_MASK_FIELD) if listed else None)
        call = float(len(self.seen_advantages) - 1)
        return {"metrics": {"pg_loss": [call, call], "grad_norm": [2.0 + call], "mfu": 0.5}}


def run_step(verl_config, rows, *, global_steps, queues):
    """The advantage step, then the actor update, of one batch; returns (queue, batch, metrics, actor group)."""
    queue = queues.new()
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    trainer = stub_trainer(verl_config, global_steps)
    trainer.actor_rollout_wg = RecordingActorGroup(queues)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics=metrics)
    batch = trainer._update_actor(batch, metrics=metrics)
    assert not any(name.startswith("dataflex_step_") for name in batch.fields)  # the workers never fetch them
    return queue, batch, metrics, trainer.actor_rollout_wg


def test_staged_mechanism_builds_from_the_experiment_command(compose_verl, kk_overrides):
    overrides = kk_overrides(["dataflex.mechanism=isolate", "dataflex.actuator.name=lopti",
                              "dataflex.actuator.params.eta=-0.4"])
    config = compose_verl(overrides)
    OmegaConf.resolve(config)
    trainer = DataflexSyncTrainer(config=config)
    assert trainer.mechanism.config.mechanism == "isolate"
    # The experiment's AR settings (alpha = 0.2) stay, so this is AR + Lopti, high-probability tokens first.
    assert dict(trainer.mechanism.config.actuator.params) == {
        "alpha": 0.2, "normalize": "mean", "tau": None, "neg_adv_weight": 1.0, "eta": -0.4, "split": "threshold"
    }


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_rollout_ref.actor.optim.lr_warmup_steps=10", "lr_warmup_steps = 10"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1", "lr_warmup_steps_ratio = 0.1"),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", "lr_scheduler_type = 'cosine'"),
        # verl's deprecated alias: FSDPOptimizerConfig copies warmup_style over lr_scheduler_type.
        ("actor_rollout_ref.actor.optim.warmup_style=cosine", "warmup_style = 'cosine'"),
        ("+actor_rollout_ref.actor.optim.lr_decay_style=linear", "lr_decay_style = 'linear'"),
    ],
    ids=["warmup-steps", "warmup-ratio", "scheduler-type", "warmup-style-alias", "megatron-decay-style"],
)
def test_staged_mechanism_refuses_a_moving_lr_schedule(compose_verl, kk_overrides, override, key):
    # Each stage steps verl's scheduler once, which verl sizes for one update per step.
    overrides = kk_overrides(["dataflex.mechanism=isolate", "dataflex.actuator.name=lopti"], [override])
    config = compose_verl(overrides)
    OmegaConf.resolve(config)
    with pytest.raises(ConfigError, match=f"actor_rollout_ref.actor.optim.{key} is not allowed"):
        mechanism_from_verl_config(config)
    # The same schedule is fine for the single-update mechanism.
    plain = compose_verl(kk_overrides([], [override]))
    OmegaConf.resolve(plain)
    assert mechanism_from_verl_config(plain).config.mechanism == "reweight"


@pytest.mark.parametrize("eta", [0.5, -0.5])
def test_lopti_runs_one_actor_update_per_stage_on_the_stage_tokens(verl_config, queues, eta):
    set_dataflex(verl_config, lopti_block(eta=eta, alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=13, prompts=3, group=4)
    queue, batch, metrics, actor = run_step(verl_config, rows, global_steps=1, queues=queues)

    # The reweighted advantages the mechanism computes on verl's GRPO advantages, split at pi < 0.5.
    verl_queue = queues.new()
    fill_queue(verl_queue, rows, with_rollout_log_probs=False)
    stub_verl_trainer(verl_config)._compute_advantage(batch, metrics={})
    fields = {name: padded(verl_queue, batch, name) for name in ("old_log_probs", "response_mask", "advantages")}
    expected, _ = build_mechanism(lopti_block(eta=eta, alpha=0.5)).apply(1, fields)
    valid = fields["response_mask"].bool()
    low = valid & (fields["old_log_probs"].exp() < 0.5)
    high = valid & ~low
    assert low.any() and high.any() and expected[valid].abs().sum() > 0
    first, second = (low, high) if eta > 0 else (high, low)

    assert len(actor.seen_advantages) == 2
    torch.testing.assert_close(actor.seen_advantages[0], torch.where(first, expected, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(actor.seen_advantages[1], torch.where(second, expected, 0.0), rtol=0, atol=0)
    # Each stage's mask reaches the workers beside its advantages (the staged loss masks KL and entropy with it).
    assert torch.equal(actor.seen_stage_masks[0].bool(), first)
    assert torch.equal(actor.seen_stage_masks[1].bool(), second)
    # Afterwards the queue holds the full reweighted advantages again (verl's step metrics read them).
    assert torch.equal(padded(queue, batch, "advantages"), expected)
    # Actor metrics: the mean over the two stages; pg_loss was 0 in the first call and 1 in the second.
    assert metrics["actor/pg_loss"] == pytest.approx(0.5)
    assert metrics["actor/grad_norm"] == pytest.approx(2.5)
    # ... and each stage's own, under actor/stage<i>/.
    assert (metrics["actor/stage0/pg_loss"], metrics["actor/stage1/pg_loss"]) == (0.0, 1.0)
    assert (metrics["actor/stage0/grad_norm"], metrics["actor/stage1/grad_norm"]) == (2.0, 3.0)
    assert "perf/stage0/mfu/actor" not in metrics and metrics["perf/mfu/actor"] == 0.5
    assert metrics[keys.UPDATE_STAGES] == 2.0
    assert metrics[keys.LOPTI_LOW_TOKEN_FRAC] == pytest.approx(float(low.sum()) / float(valid.sum()))


def test_lopti_before_warmup_and_reweight_run_one_plain_update(verl_config, queues):
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=17, prompts=2, group=4)
    set_dataflex(verl_config, lopti_block(warmup_step=3))
    queue, batch, metrics, actor = run_step(verl_config, rows, global_steps=2, queues=queues)
    assert len(actor.seen_advantages) == 1
    assert torch.equal(actor.seen_advantages[0], padded(queue, batch, "advantages"))
    assert actor.seen_stage_masks == [None]  # a plain update: verl's own loss path, no stage mask
    assert metrics[keys.UPDATE_STAGES] == 1.0 and metrics[keys.ACTIVE] == 0.0
    assert not any(key.startswith("actor/stage") for key in metrics)
    assert keys.LOPTI_LOW_TOKEN_FRAC not in metrics

    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    queue, batch, metrics, actor = run_step(verl_config, rows, global_steps=2, queues=queues)
    assert len(actor.seen_advantages) == 1
    assert torch.equal(actor.seen_advantages[0], padded(queue, batch, "advantages"))
    assert metrics["actor/pg_loss"] == 0.0 and metrics[keys.UPDATE_STAGES] == 1.0


def test_the_stages_ride_with_their_rows(verl_config, queues):
    """Each row's stage masks are TransferQueue fields of that row: a handle listing the rows in another order
    updates every row with its own stage's advantages."""
    set_dataflex(verl_config, lopti_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=19, prompts=2, group=4)
    _, _, _, in_order = run_step(verl_config, rows, global_steps=1, queues=queues)
    queue = queues.new()
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    trainer = stub_trainer(verl_config, global_steps=1)
    trainer.actor_rollout_wg = RecordingActorGroup(queues)
    batch = trainer._compute_advantage(batch, metrics={})
    assert queue.puts[-1] == ("advantages", f"{STAGE_FIELD}0", f"{STAGE_FIELD}1")
    reordered = KVBatchMeta(keys=list(reversed(batch.keys)), tags=batch.tags, partition_id=batch.partition_id,
                            fields=batch.fields)
    trainer._update_actor(reordered, metrics={})
    assert len(trainer.actor_rollout_wg.seen_advantages) == 2
    for ours, theirs in zip(trainer.actor_rollout_wg.seen_advantages, in_order.seen_advantages, strict=True):
        assert torch.equal(ours, theirs.flip(0))


# --- token rules that read the old policy's entropy -----------------------------------------------------------------
HIGH_ENTROPY = {"mechanism": "reweight", "scorer": {"name": "entropy", "params": {}},
                "actuator": {"name": "entropy_quantile", "params": {"rho": 0.3}}, "warmup_step": 0}


def test_entropy_rules_read_verls_entropy_field_and_equal_the_mechanism(verl_config, queues, monkeypatch):
    import wandb

    logged = []
    monkeypatch.setattr(wandb, "run", SimpleNamespace(id="run-1", tags=()))
    monkeypatch.setattr(wandb, "log", lambda payload, step: logged.append(payload))
    set_dataflex(verl_config, HIGH_ENTROPY)
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=13, prompts=3, group=4)
    generator = torch.Generator().manual_seed(13)
    for row in rows:
        row["entropy"] = (torch.rand(len(row["mask"]), generator=generator) * 2).tolist()
    queue = queues.new()
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    metrics: dict = {}
    trainer = stub_trainer(verl_config, global_steps=1, histogram_logger=WandbHistogramLogger("reweight"))
    trainer._compute_advantage(batch, metrics=metrics)

    verl_queue = queues.new()
    fill_queue(verl_queue, rows, with_rollout_log_probs=False)
    stub_verl_trainer(verl_config)._compute_advantage(batch, metrics={})
    fields = {name: padded(verl_queue, batch, name)
              for name in ("old_log_probs", "response_mask", "advantages", "entropy")}
    expected, expected_metrics = build_mechanism(HIGH_ENTROPY).apply(1, fields)
    assert torch.equal(padded(queue, batch, "advantages"), expected)
    assert 0.3 <= metrics[keys.KEPT_TOKEN_FRAC] == expected_metrics[keys.KEPT_TOKEN_FRAC] < 1.0
    assert set(logged[0]) == {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB, keys.HIST_ENTROPY}


def test_entropy_rules_are_refused_under_bypass_mode_where_verl_computes_no_entropy(verl_config):
    set_dataflex(verl_config, HIGH_ENTROPY)
    verl_config.algorithm.rollout_correction.bypass_mode = True
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction\.bypass_mode = True is not allowed with "
                                          r"dataflex\.scorer\.name = 'entropy'"):
        DataflexSyncTrainer(config=verl_config)
    set_dataflex(verl_config, dataflex_block(alpha=0.5))  # AR reads old_log_probs only: fine under bypass mode
    assert mechanism_from_verl_config(verl_config).config.scorer.name == "token_prob"


# --- the probability change (dataflex_stats.prob_change_every) ------------------------------------------------------
class FakeActorWorkers:
    """``compute_log_prob`` as verl's actor workers answer it: ``log_probs`` over prompt + response in TransferQueue,
    shifted by one (the response's log-probs sit at positions [T - r - 1, T - 1)). Here: the old log-probs + 0.1
    on positive-advantage rows' tokens, - 0.1 elsewhere (a policy that moved as the advantages say, then clipped)."""

    def __init__(self, queue, shift: dict[str, float]) -> None:
        self.queue, self.shift, self.calls = queue, shift, []

    def update_actor(self, batch) -> dict:
        self.calls.append("update_actor")
        return {"metrics": {"pg_loss": [0.0], "mfu": 0.5}}

    def compute_log_prob(self, batch):
        self.calls.append(dict(batch.extra_info))
        for key in batch.keys:
            row = self.queue.row(batch.partition_id, key)
            new = (row["old_log_probs"] + self.shift[key]).clamp(max=0.0)
            row["log_probs"] = torch.cat([torch.zeros(1), new, torch.zeros(1)])  # one prompt token, then the shift
        return batch


def test_probability_change_reads_the_updated_actors_log_probs(verl_config, queues):
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex_stats = {"prob_change_every": 2}
    OmegaConf.set_struct(verl_config, True)
    set_dataflex(verl_config, dataflex_block(alpha=0.5))
    verl_config.actor_rollout_ref.rollout.n = 4
    rows = random_rows(seed=21, prompts=2, group=4)
    queue = queues.new()
    batch = fill_queue(queue, rows, with_rollout_log_probs=False)
    trainer = stub_trainer(verl_config, global_steps=1)
    trainer.prob_change_every = prob_change_every(verl_config)
    assert BASE_ADVANTAGES_FIELD not in trainer._compute_advantage(batch, metrics={}).fields  # step 1: not measured
    trainer.global_steps = 2
    batch = trainer._compute_advantage(fill_queue(queue, rows, with_rollout_log_probs=False), metrics={})
    assert BASE_ADVANTAGES_FIELD in batch.fields
    change = SimpleNamespace(**{name: padded(queue, batch, field) for name, field in (
        ("old_log_probs", "old_log_probs"), ("advantages", BASE_ADVANTAGES_FIELD), ("response_mask", "response_mask"))})
    change.response_mask = change.response_mask.bool()
    # the advantages kept are verl's, before the mechanism reweighted them
    assert not torch.equal(change.advantages, padded(queue, batch, "advantages"))
    signs = {key: float(torch.sign(change.advantages[index][change.response_mask[index]].sum()))
             for index, key in enumerate(batch.keys)}
    trainer.actor_rollout_wg = FakeActorWorkers(queue, {key: 0.1 * sign for key, sign in signs.items()})
    metrics: dict = {}
    trainer._update_actor(batch, metrics=metrics)
    update, measure = trainer.actor_rollout_wg.calls  # the measurement reads the updated actor
    assert update == "update_actor" and measure["calculate_entropy"] is False
    # Each row's advantage has one sign (GRPO: one per response); its tokens moved that way unless clipped at pi = 1.
    old = change.old_log_probs[change.response_mask]
    expected = prob_change_stats_reference(change, signs, batch.keys)
    assert metrics[keys.PROB_CHANGE_CORRECT_SHARE] == pytest.approx(expected)
    assert 0.5 < metrics[keys.PROB_CHANGE_CORRECT_SHARE] <= 1.0 and bool((old < 0).any())


def prob_change_stats_reference(change, signs, keys_in_order) -> float:
    """The share of signed tokens that moved their way: tokens of rows with a non-zero sign, except those already at
    log-prob 0 that were pushed up (clamped: unchanged)."""
    moved = total = 0
    for index, key in enumerate(keys_in_order):
        sign = signs[key]
        advantages = change.advantages[index][change.response_mask[index]]
        old = change.old_log_probs[index][change.response_mask[index]]
        signed = advantages != 0
        total += int(signed.sum())
        if sign > 0:
            moved += int((signed & (old < 0)).sum())
        elif sign < 0:
            moved += int(signed.sum())
    return moved / total


@pytest.mark.parametrize(("block", "message"), [
    ({"prob_change_every": -1}, r"dataflex_stats\.prob_change_every = -1 is not allowed"),
    ({"every": 2}, r"dataflex_stats.*unknown key\(s\) 'every'"),
])
def test_bad_stats_block_fails_at_build(verl_config, block, message):
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex_stats = block
    OmegaConf.set_struct(verl_config, True)
    with pytest.raises(ConfigError, match=message):
        DataflexSyncTrainer(config=verl_config)
