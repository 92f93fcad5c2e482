"""verl's CPU mode end to end: verl 0.9.1's real V1 trainer with ``trainer.v1.trainer_mode=dataflex_sync``.

Each test launches ``python -m verl.trainer.main_ppo`` (:mod:`tests.verl.cpu_mode`): real Ray actors and worker
groups, TransferQueue, the FSDP2 engine on gloo, verl's reward manager and checkpoint engine, the ``dataflex_cpu``
rollout server with weights synced every step. One short AR run is in the fast tier; the rest are slow.

What a step's metrics say about the loss: with one policy update per step and no KL, the first mini-batch's
importance ratio is exactly 1 (the old log-probs come from the same weights), so verl's token-mean
``actor/pg_loss`` is ``-mean(A_t)`` over the batch's valid tokens, and ``critic/advantages/mean`` is verl's
token-mean of the advantages the actor received: ``pg_loss == -critic/advantages/mean`` says the actor's loss used
exactly the advantages the mechanism wrote.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import load_histograms, read_metrics, read_meta, read_status

from cpu_mode import prepare_folder, run_verl, write_test_experiment  # noqa: E402  (sibling module; tests/verl is on sys.path)
from sweeps.backends.verl import preset_overrides

AR = ["dataflex.actuator.params.alpha=0.5"]
BASELINE = ["dataflex.actuator.params.alpha=0.0"]
LOPTI = ["dataflex.mechanism=isolate", "dataflex.actuator.name=lopti", "dataflex.actuator.params.eta=0.5"]
VAL_EVERY_STEP = ["trainer.test_freq=1"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experiment's model, tokenizer and data (a short SFT), shared by the module's runs."""
    return prepare_folder(tmp_path_factory.mktemp("verl_cpu"))


def completed_metrics(run) -> pd.DataFrame:
    """The run's metrics after checking it exited 0 and its run store says completed."""
    assert run.returncode == 0, run.tail()
    status = read_status(run.run_dir)
    assert status["state"] == "completed", status
    return read_metrics(run.run_dir).set_index("step")


def assert_actor_used_written_advantages(metrics: pd.DataFrame) -> None:
    """``actor/pg_loss == -critic/advantages/mean`` at every training step (see the module docstring)."""
    training = metrics.loc[metrics.index > 0]
    assert len(training) >= 1
    for step, row in training.iterrows():
        assert row["actor/pg_loss"] == pytest.approx(-row["critic/advantages/mean"], rel=1e-3, abs=1e-7), step


def test_ar_run_on_the_real_trainer_reweights_what_the_actor_sees(prepared, tmp_path):
    run = run_verl(prepared, tmp_path / "ar", dataflex=AR, extra=VAL_EVERY_STEP)
    metrics = completed_metrics(run)
    assert list(metrics.index) == [0, 1, 2]  # the validation before training, then the two steps
    assert metrics[keys.VAL_ACCURACY].notna().all()  # validated at 0, 1 and 2 (verl's val-core, one data source)
    training = metrics.loc[[1, 2]]
    assert (training["critic/score/mean"] > 0).all()  # correct answers in the groups: advantages to reweight
    assert (training["critic/advantages/max"] > 0).all() and (training["critic/advantages/min"] < 0).all()
    assert (training["dataflex/weight/std"] > 0).all()  # AR at alpha 0.5 moved the weights off 1
    assert training["dataflex/weight/mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)  # mean-normalised
    assert (training[keys.UPDATE_STAGES] == 1).all()
    assert_actor_used_written_advantages(metrics)
    # The rollout server held the trainer's weights: its sampling log-probs match the trainer's recomputed ones.
    assert (training["training/rollout_actor_probs_pearson_corr"] > 0.999).all()
    histograms = load_histograms(run.run_dir)
    assert {"dataflex/hist/weight", "dataflex/hist/token_prob"} <= set(histograms["name"])
    assert read_meta(run.run_dir)["backend"] == "verl"


# The quantities that do not depend on the order of a batch's rows, exactly; those that sum over them in float32, to
# rounding. verl's CPU run is not bit-for-bit repeatable: the agent loop's responses reach the batch in the order
# their requests finish, so the rows (and the float32 sums over them: log-probs of a padded micro-batch, the loss,
# the gradient) come in another order from run to run, while the responses and their scores are the same set
# (measured: scores and lengths equal, pg_loss and advantages to 4e-6 relative, grad_norm to 3e-3 after a step).
ORDER_FREE = ("critic/score/mean", "critic/score/max", "response_length/mean", "response_length/max",
              "prompt_length/mean")
ROUNDED = {"critic/advantages/mean": 1e-4, "actor/pg_loss": 1e-4, "actor/grad_norm": 1e-2}


@pytest.mark.slow
def test_alpha_zero_changes_nothing_and_alpha_half_changes_the_loss(prepared, tmp_path):
    """alpha = 0 under dataflex_sync gives verl's own sync trainer's metrics step for step (same seed), up to the
    row order of a batch (see :data:`ORDER_FREE`); alpha 0.5 sees the same first rollouts and scores but a
    different loss, each run's loss its own advantages'."""
    plain = run_verl(prepared, tmp_path / "sync", dataflex=BASELINE,
                     extra=["trainer.v1.trainer_mode=sync", "trainer.logger=[console,file]"],
                     environment={"VERL_FILE_LOGGER_PATH": str(tmp_path / "sync.jsonl")})
    assert plain.returncode == 0, plain.tail()
    sync_steps = {line["step"]: line["data"] for line in map(json.loads, (tmp_path / "sync.jsonl").open())}
    baseline = completed_metrics(run_verl(prepared, tmp_path / "a0", dataflex=BASELINE))
    reweighted = completed_metrics(run_verl(prepared, tmp_path / "a05", dataflex=AR))

    for step in (1, 2):
        for name in ORDER_FREE:
            assert baseline.loc[step, name] == sync_steps[step][name], (step, name)
        for name, tolerance in ROUNDED.items():
            assert baseline.loc[step, name] == pytest.approx(sync_steps[step][name], rel=tolerance), (step, name)
    assert (baseline.loc[[1, 2], "dataflex/weight/std"] == 0.0).all()
    assert baseline.loc[1, "critic/score/mean"] > 0  # there were advantages to change
    # Step 1 samples from the same SFT weights with the same seeds: same responses and scores, other advantages.
    for name in ORDER_FREE:
        assert reweighted.loc[1, name] == baseline.loc[1, name], name
    assert reweighted.loc[1, "actor/pg_loss"] != pytest.approx(baseline.loc[1, "actor/pg_loss"], rel=1e-2)
    assert_actor_used_written_advantages(baseline)
    assert_actor_used_written_advantages(reweighted)


@pytest.mark.slow
def test_lopti_runs_two_actor_updates_on_the_workers_with_per_stage_kl(prepared, tmp_path):
    run = run_verl(prepared, tmp_path / "lopti", dataflex=LOPTI,
                   extra=["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.01"])
    metrics = completed_metrics(run)
    training = metrics.loc[metrics.index > 0]
    assert (training[keys.UPDATE_STAGES] == 2).all()
    for stage in (0, 1):
        assert training[keys.stage_metric(stage, "actor/pg_loss")].notna().all()
    # Step 1 starts at the reference weights: stage 0's KL is exactly 0; stage 1 runs after stage 0's update, so
    # its tokens' KL to the reference is positive. The staged loss (set_loss_fn on the real workers) made both.
    assert training.loc[1, keys.stage_metric(0, "actor/kl_loss")] == pytest.approx(0.0, abs=1e-9)
    assert training.loc[1, keys.stage_metric(1, "actor/kl_loss")] > 0


@pytest.mark.slow
def test_checkpoint_resume_continues_the_run_store_without_gaps_or_repeats(prepared, tmp_path):
    run_dir = tmp_path / "resume"
    first = run_verl(prepared, run_dir, dataflex=AR, extra=["trainer.save_freq=1"])
    assert list(completed_metrics(first).index) == [0, 1, 2]
    assert (run_dir / "checkpoints" / "global_step_2").is_dir()
    second = run_verl(prepared, run_dir, dataflex=AR, steps=3, extra=["trainer.save_freq=1", "trainer.resume_mode=auto"])
    metrics = completed_metrics(second)
    assert list(metrics.index) == [0, 1, 2, 3]  # steps 1-2 kept from the first run, 3 from the resumed one
    assert read_meta(run_dir)["resumed_from_step"] == 2


@pytest.mark.slow
def test_a_failure_inside_verl_ends_failed_with_its_traceback(prepared, tmp_path):
    # The rollout server refuses top-k sampling: the validation before training fails inside verl's fit.
    run = run_verl(prepared, tmp_path / "fails", dataflex=AR, extra=["actor_rollout_ref.rollout.val_kwargs.top_k=5"])
    assert run.returncode != 0
    status = read_status(run.run_dir)
    assert status["state"] == "failed", status
    assert "Traceback" in status["traceback"] and status["error"]


@pytest.mark.slow
def test_wandb_offline_files_of_a_verl_run_carry_identity_and_histograms(prepared, tmp_path):
    from dataflex_rl.tracking.wandb_file import history, read_run, run_files

    wandb_dir = tmp_path / "wandb"
    run = run_verl(prepared, tmp_path / "a0.5-s1", dataflex=AR,
                   extra=["trainer.logger=[console,wandb]", "+dataflex_run.sweep=cpu-wandb",
                          "+dataflex_run.axes=[dataflex.actuator.params.alpha,seed]"],
                   environment={"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir)})
    completed_metrics(run)
    [run_file] = run_files(wandb_dir)
    record = read_run(run_file)
    assert (record.name, record.group, record.job_type) == ("a0.5-s1", "cpu-wandb", "a0.5")
    assert {"verl", "reweight"} <= set(record.tags)
    assert record.exit_code == 0
    rows = history(run_file)
    histogram_steps = [step for step, row in rows.items() if is_histogram(row, "dataflex/hist/weight")]
    assert len(histogram_steps) == 2  # one weight histogram per training step, at verl's step
    assert any("dataflex/weight/std" in row for row in rows.values())


def is_histogram(row: dict, name: str) -> bool:
    """Whether a decoded W&B history row holds a histogram under ``name`` (nested keys or one dict value)."""
    value = row.get(name)
    return row.get(f"{name}/_type") == "histogram" or (isinstance(value, dict) and value.get("_type") == "histogram")


@pytest.mark.slow
def test_a_two_run_verl_sweep_on_the_cpu_gives_a_report(tmp_path, monkeypatch):
    from sweeps.cli import main as sweep_main

    path = write_test_experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = sweep_main(["backend=verl", f"verl.experiment={path}", "alpha=0.5", "seeds=1", "steps=2", "jobs=1",
                       f"root={tmp_path / 'runs'}", "name=cpu"])
    assert code == 0
    report = tmp_path / "runs" / "cpu" / "report" / "report.md"
    text = report.read_text()
    assert "0.5" in text and "baseline" in text
    for run in ("a0.0-s1", "a0.5-s1"):
        assert read_status(tmp_path / "runs" / "cpu" / run)["state"] == "completed"
        assert math.isfinite(read_metrics(tmp_path / "runs" / "cpu" / run)[keys.VAL_ACCURACY].iloc[-1])
    assert os.path.isdir(tmp_path / "runs" / "cpu" / "verl_prepared" / "sft-seed1" / "model")
    meta = read_meta(tmp_path / "runs" / "cpu" / "a0.5-s1")
    assert meta["warm_start"]["design"] == "per_seed"
    assert meta["warm_start"]["checkpoint"].endswith("verl_prepared/sft-seed1/model")


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["high_entropy", "stapo", "ar_sigmoid"])
def test_token_rule_presets_run_on_the_real_trainer(prepared, tmp_path, preset):
    """Each token rule's preset, as ``make sweep BACKEND=verl MECH=<preset>`` passes it: the entropy rules read the
    ``entropy`` verl's ``_compute_old_log_prob`` wrote, and the actor's loss uses the advantages they wrote."""
    run = run_verl(prepared, tmp_path / preset, dataflex=preset_overrides(preset))
    metrics = completed_metrics(run)
    training = metrics.loc[metrics.index > 0]
    assert (training[keys.ACTIVE] == 1.0).all() and (training["critic/score/mean"] > 0).all()
    kept = training[keys.KEPT_TOKEN_FRAC]
    if preset == "high_entropy":
        assert kept.between(0.2 - 1e-9, 1.0).all() and (kept < 1.0).all()
    else:
        assert kept.between(0.9, 1.0).all()
        assert training["dataflex/weight/mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    assert_actor_used_written_advantages(metrics)
    names = set(load_histograms(run.run_dir)["name"])
    assert (keys.HIST_ENTROPY in names) == (preset != "ar_sigmoid")


@pytest.mark.slow
def test_band_preset_with_the_probability_change_on_the_real_trainer(prepared, tmp_path):
    """The quartile experiment on verl (band_q4: only tokens with pi >= 0.75 update) with the optional probability
    change measured every step: one more compute_log_prob pass of the updated actor, the local backend's metrics."""
    run = run_verl(prepared, tmp_path / "band", dataflex=preset_overrides("band_q4"),
                   extra=["+dataflex_stats.prob_change_every=1"])
    metrics = completed_metrics(run)
    training = metrics.loc[metrics.index > 0]
    high_share = training[keys.grad_by_prob("0.75-1.00", "token_share")]
    assert training[keys.KEPT_TOKEN_FRAC].to_numpy() == pytest.approx(high_share.to_numpy(), abs=1e-6)
    assert_actor_used_written_advantages(metrics)
    correct = training[keys.PROB_CHANGE_CORRECT_SHARE]
    assert correct.between(0.0, 1.0).all() and correct.notna().all()
    cells = [keys.prob_change(sign, "0.75-1.00", "token_share") for sign in keys.ADVANTAGE_SIGNS]
    assert (training[cells].sum(axis=1) > 0).all()


@pytest.mark.slow
def test_long_addition_trains_on_the_real_trainer_with_responses_that_reason(tmp_path):
    # The task's data files through the same prepare step; responses of about 39 characters need a longer limit.
    prepared = prepare_folder(tmp_path, ("task=long_addition", "sft.steps=250", "sft.target_accuracy=null"))
    run = run_verl(prepared, tmp_path / "run", dataflex=AR, steps=1,
                   extra=["data.max_prompt_length=16", "data.max_response_length=48"])
    metrics = completed_metrics(run)
    assert metrics.loc[1, "response_length/mean"] >= 30  # the trace before the answer
    assert metrics.loc[1, "dataflex/weight/std"] > 0
    assert 0.0 <= metrics.loc[1, "critic/score/mean"] <= 1.0 and metrics[keys.VAL_ACCURACY].notna().any()
