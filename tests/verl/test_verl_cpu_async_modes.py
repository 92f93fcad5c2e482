"""verl's asynchronous trainer modes end to end in verl's CPU mode, with the mechanism.

``dataflex_colocate_async``: the rollout beside the trainer's workers, prompts of the next step generated while the
trainer trains, replicas aborted, put to sleep and resumed around each weight sync (verl's
``FullyAsyncLLMServerClient``). ``dataflex_separate_async``: the rollout on its own resource pool (one more Ray
logical GPU), the async replay buffer, weights synced across the pools by the ``dataflex_cpu`` checkpoint engine.
In both, step 2 trains on responses sampled before step 1's update (``trajectory_staleness`` 1), and the weights
read the current actor's recomputed ``old_log_probs`` (no bypass mode): the importance ratio of the first update is
1, so ``actor/pg_loss == -critic/advantages/mean`` still says the actor used the advantages the mechanism wrote.
Each run takes about 2-3 minutes on two cores: slow tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import load_histograms, read_meta

from cpu_mode import prepare_folder, run_verl  # noqa: E402  (sibling module; tests/verl is on sys.path)
from test_verl_cpu_mode import AR, LOPTI, assert_actor_used_written_advantages, completed_metrics

STALENESS = "training/off_policy/trajectory_staleness/mean"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experiment's model, tokenizer and data (a short SFT), shared by the module's runs."""
    return prepare_folder(tmp_path_factory.mktemp("verl_cpu_async"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dataflex_colocate_async", "dataflex_separate_async"])
def test_ar_runs_in_the_asynchronous_mode_and_writes_its_run_store(prepared, tmp_path, mode):
    run = run_verl(prepared, tmp_path / mode, dataflex=AR, extra=[f"trainer_mode={mode}"])
    metrics = completed_metrics(run)
    training = metrics.loc[[1, 2]]
    assert list(training[STALENESS]) == [0.0, 1.0]  # step 2 trains on the batch sampled before step 1's update
    assert (training["critic/score/mean"] > 0).all()
    assert (training["dataflex/weight/std"] > 0).all()
    assert training["dataflex/weight/mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    assert (training[keys.UPDATE_STAGES] == 1).all()
    assert_actor_used_written_advantages(metrics)
    # The rollout got the trainer's weights (digest-checked on every sync): after step 1's update it samples
    # from them, so the recomputed log-probs of step 2's stale batch differ from the rollout's, but only a little.
    assert (training["training/rollout_actor_probs_pearson_corr"] > 0.98).all()
    histograms = load_histograms(run.run_dir)
    assert {"dataflex/hist/weight", "dataflex/hist/token_prob"} <= set(histograms["name"])
    assert read_meta(run.run_dir)["backend"] == "verl"


@pytest.mark.slow
def test_separate_async_with_two_mini_batches_reweights_each_and_sums_the_histograms(prepared, tmp_path):
    """``parameter_sync_step=2``: two advantage steps and two actor updates per step, one histogram per step that
    counts every valid token of both mini-batches."""
    run = run_verl(prepared, tmp_path / "two", dataflex=AR,
                   extra=["trainer_mode=dataflex_separate_async", "trainer.v1.separate_async.parameter_sync_step=2",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # 8 prompts x 8 responses per update
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"])
    metrics = completed_metrics(run)
    histograms = load_histograms(run.run_dir)
    weights = histograms[histograms["name"] == "dataflex/hist/weight"].set_index("step")
    for step in (1, 2):
        assert metrics.loc[step, "dataflex/weight/std"] > 0
        counted = sum(weights.loc[step, "counts"])
        # verl averages the two mini-batches' valid-token counts; the histogram sums them.
        assert counted == pytest.approx(2 * metrics.loc[step, keys.VALID_TOKENS])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dataflex_colocate_async", "dataflex_separate_async"])
def test_lopti_runs_its_two_stages_in_the_asynchronous_mode(prepared, tmp_path, mode):
    run = run_verl(prepared, tmp_path / mode, dataflex=LOPTI,
                   extra=[f"trainer_mode={mode}", "actor_rollout_ref.actor.use_kl_loss=true",
                          "actor_rollout_ref.actor.kl_loss_coef=0.01"])
    training = completed_metrics(run).loc[[1, 2]]
    assert (training[keys.UPDATE_STAGES] == 2).all()
    # Step 1 starts at the reference weights: stage 0's KL is 0, stage 1's (after stage 0's update) positive.
    assert training.loc[1, keys.stage_metric(0, "actor/kl_loss")] == pytest.approx(0.0, abs=1e-9)
    assert training.loc[1, keys.stage_metric(1, "actor/kl_loss")] > 0
