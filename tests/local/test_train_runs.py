"""Tier 3: short real runs through the real entry point, in tmp_path."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from dataflex_rl import keys
from dataflex_rl.local.train import run
from dataflex_rl.tracking.run_store import load_histograms, read_metrics

from .conftest import REPO, compose_train, run_cli, tiny_overrides

TIMING_PREFIX = "timing_s/"


def metrics_without_timing(run_dir) -> pd.DataFrame:
    frame = read_metrics(run_dir)
    return frame[[c for c in frame.columns if not c.startswith(TIMING_PREFIX)]]


def test_three_step_cli_run_writes_every_artifact(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    result = run_cli(tiny_overrides(run_dir, sft_cache) + ["logger.wandb.mode=offline"])
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("config.yaml", "meta.json", "status.json", "metrics.jsonl", "metrics.parquet", "histograms.parquet",
                 "train.log", "checkpoints/last.pt"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B offline files missing"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["backend"] == "local" and meta["alpha"] == 0.5 and meta["seed"] == 1
    frame = read_metrics(run_dir)
    assert list(frame["step"]) == [0, 1, 2, 3]
    train_keys = [
        keys.SCORE_MEAN, keys.ADV_MEAN, keys.ADV_MAX, keys.ADV_MIN, keys.PG_LOSS, keys.GRAD_NORM,
        keys.GRAD_NORM_CLIPPED, keys.PG_CLIPFRAC, keys.PPO_KL, keys.ENTROPY, keys.RESPONSE_LENGTH_MEAN,
        keys.TIMING_GEN, keys.TIMING_UPDATE, keys.TIMING_STEP, *keys.WEIGHT_KEYS, keys.TOKEN_PROB_MEAN,
        keys.TOKEN_PROB_LOW_FRAC, keys.ACTIVE, keys.GRAD_LOW_PROB_SHARE,
        keys.grad_by_prob("0.00-0.25", "token_share"), keys.grad_by_prob("0.75-1.00", "logit_grad_norm_share"),
    ]
    for key in train_keys:
        assert key in frame.columns, key
        assert frame.loc[frame.step >= 1, key].notna().all(), key
    # every logged key is one plan_metric= and the study's metric= accept (dataflex_rl.keys.is_metric_key)
    assert [key for key in frame.columns if key != "step" and not keys.is_metric_key(key)] == []
    # Validation at the start, every 2 steps and at the end; exact per-bucket gradients every 2 steps.
    assert frame.set_index("step")[keys.VAL_ACCURACY].notna().tolist() == [True, False, True, True]
    # each validation its seconds; the process's start-up once, at its first step, and longer than the imports
    timing = frame.set_index("step")
    assert timing[keys.TIMING_VAL].notna().tolist() == [True, False, True, True]
    # seconds of this validation: above 0 and below the run's own wall time (not a clock's reading)
    wall_time = json.loads((run_dir / "meta.json").read_text())["wall_time_s"]
    assert (timing[keys.TIMING_VAL].dropna() > 0).all() and timing[keys.TIMING_VAL].sum() < wall_time
    assert timing[keys.TIMING_STARTUP].notna().tolist() == [False, True, False, False]
    assert timing.loc[1, keys.TIMING_STARTUP] > 1.0  # a fresh interpreter importing torch: seconds, not 0
    exact = frame.set_index("step")[keys.grad_by_prob("0.00-0.25", "param_grad_norm")]
    assert exact.notna().tolist() == [False, False, True, False]
    share_columns = [c for c in frame.columns if c.endswith("/logit_grad_norm_share")]
    norm_columns = [c for c in frame.columns if c.endswith("/logit_grad_norm")]
    for _, row in frame[frame.step >= 1].iterrows():
        # Shares add up to 1 whenever any token carries a gradient (all-equal rewards give zero advantages).
        expected = 1.0 if row[norm_columns].sum() > 0 else 0.0
        assert row[share_columns].sum() == pytest.approx(expected)
    hists = load_histograms(run_dir)
    assert set(hists["name"]) == {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB}
    assert sorted(set(hists["step"])) == [1, 2, 3]


def test_same_seed_same_metrics_and_alpha_zero_equals_baseline_preset(tmp_path, sft_cache):
    def one(name, extra):
        run_dir = tmp_path / name
        assert run(compose_train(tiny_overrides(run_dir, sft_cache) + extra)) == 0
        return metrics_without_timing(run_dir)

    first = one("a", ["dataflex.actuator.params.alpha=0.0"])
    again = one("b", ["dataflex.actuator.params.alpha=0.0"])
    pd.testing.assert_frame_equal(first, again)  # same seed, same numbers, bit for bit
    baseline = one("baseline", ["dataflex=baseline"])
    pd.testing.assert_frame_equal(first, baseline)
    other_seed = one("seed2", ["dataflex=baseline", "seed=2"])
    assert not first[keys.TOKEN_PROB_MEAN].equals(other_seed[keys.TOKEN_PROB_MEAN])
    assert first[keys.SCORE_MEAN].iloc[1:].max() > 0  # the warm start earns reward, so the updates do something
    reweighted = one("alpha1", ["dataflex.actuator.params.alpha=1.0"])
    # Step 1 has the same rollout (same seed, same warm start); only the weights differ.
    assert reweighted.loc[1, keys.SCORE_MEAN] == first.loc[1, keys.SCORE_MEAN]
    assert reweighted.loc[1, keys.WEIGHT_PREFIX + "/std"] > 0 == first.loc[1, keys.WEIGHT_PREFIX + "/std"]


@pytest.mark.slow
def test_resume_after_kill_keeps_metric_rows_unique_and_contiguous(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    # 20 steps of ~40 ms leave a wide window between "step 3 is logged" and the end of the run for the kill.
    overrides = tiny_overrides(run_dir, sft_cache, steps=20)
    reference_dir = tmp_path / "reference"
    assert run(compose_train(tiny_overrides(reference_dir, sft_cache, steps=20))) == 0  # also warms the SFT cache
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "dataflex_rl.local.train", *overrides], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    metrics_file = run_dir / "metrics.jsonl"
    while time.time() < deadline:
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 4:
            break
        if process.poll() is not None:
            pytest.fail("the run ended before it could be killed")
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_rows = len(metrics_file.read_text().splitlines())
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # killed: no chance to close
    assert 4 <= killed_rows <= 20
    result = run_cli(overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    frame = metrics_without_timing(run_dir)
    assert list(frame["step"]) == list(range(21))
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["resumed_from_step"] >= 1
    # Resuming replays exactly what the uninterrupted run did.
    pd.testing.assert_frame_equal(frame, metrics_without_timing(reference_dir))
    # A completed run is left alone.
    again = run_cli(overrides)
    assert again.returncode == 0 and "already completed" in again.stdout


def test_bad_dataflex_config_fails_before_any_model_is_built(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    result = run_cli(tiny_overrides(run_dir, sft_cache) + ["dataflex.actuator.params.alpha=1.5"])
    assert result.returncode == 2
    assert "dataflex.actuator.params.alpha = 1.5 is not allowed" in result.stderr
    # Only Hydra's log (appended, never truncated) may exist: no run store, no model, no SFT started.
    assert not run_dir.exists() or {p.name for p in run_dir.iterdir()} <= {"train.log"}
    result = run_cli(tiny_overrides(run_dir, sft_cache) + ["trainer.lr=-1"])
    assert result.returncode == 2 and "trainer.lr = -1" in result.stderr


def test_existing_run_folder_is_not_touched_by_a_bad_config(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    assert run(compose_train(tiny_overrides(run_dir, sft_cache, steps=1))) == 0
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.is_file()}
    assert run(compose_train(tiny_overrides(run_dir, sft_cache, steps=1) + ["trainer.adv_estimator=nope"])) == 2
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.is_file()} == before
    assert math.isfinite(read_metrics(run_dir)[keys.VAL_ACCURACY].iloc[-1])


def test_restart_of_a_run_that_left_no_checkpoint_logs_each_step_once(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, sft_cache, steps=2) + ["trainer.save_every=0"]
    assert run(compose_train(overrides)) == 0
    # An attempt that died before any checkpoint: its lines are in the jsonl, its status is not completed.
    (run_dir / "status.json").write_text(json.dumps({"state": "failed", "step": 2}))
    assert run(compose_train(overrides)) == 0
    assert list(read_metrics(run_dir)["step"]) == [0, 1, 2]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.kl_type=full", "trainer.kl_type = 'full' is not allowed"),
        ("trainer.adv_estimator=gae", "trainer.adv_estimator = 'gae' is not allowed; allowed values"),
        ("trainer.policy_loss=nope", "trainer.policy_loss = 'nope' is not allowed"),
        # registered by this project's verl plugin (loaded in this process), for verl's trainers only
        ("trainer.policy_loss=dataflex", "trainer.policy_loss = 'dataflex' is not allowed; allowed values (verl's, "
                                         "usable here): bypass_mode, cispo"),
        ("dataflex.actuator.name=lopti", "cannot drive dataflex.mechanism = 'reweight'"),
    ],
)
def test_settings_the_trainer_cannot_run_are_refused_up_front(tmp_path, sft_cache, override, message, capsys):
    assert run(compose_train(tiny_overrides(tmp_path / "run", sft_cache) + [override])) == 2
    assert message in capsys.readouterr().err


def test_knights_and_knaves_run_and_a_local_checkpoint_as_model_path(tmp_path, sft_cache):
    kk = ["task=knights_knaves", "task.test_size=16", "trainer.max_new_tokens=6"]
    kk_overrides = [o for o in tiny_overrides(tmp_path / "kk", sft_cache, steps=2) if not o.startswith("task.")] + kk
    assert run(compose_train(kk_overrides)) == 0
    frame = read_metrics(tmp_path / "kk")
    assert list(frame["step"]) == [0, 1, 2] and keys.val_accuracy_by_difficulty(3) in frame.columns
    # The cached SFT checkpoint is a plain Hugging Face folder: load it as a local model and skip SFT.
    checkpoint = json.loads((tmp_path / "kk" / "meta.json").read_text())["sft_checkpoint"]
    local = [o for o in kk_overrides if not o.startswith(("run_dir=", "sft.steps="))]
    assert run(compose_train(local + [f"run_dir={tmp_path / 'local'}", f"model.path={checkpoint}", "sft.steps=0"])) == 0
    first = read_metrics(tmp_path / "kk")
    second = read_metrics(tmp_path / "local")
    assert first[keys.VAL_ACCURACY].iloc[0] == second[keys.VAL_ACCURACY].iloc[0]  # same weights, same greedy answers


def test_missing_model_path_is_a_clear_error(tmp_path, sft_cache, capsys):
    code = run(compose_train(tiny_overrides(tmp_path / "run", sft_cache) + [f"model.path={tmp_path / 'nope'}"]))
    assert code == 2
    assert "model.path" in capsys.readouterr().err


def test_a_run_dir_that_is_a_sweep_folder_is_refused_and_nothing_is_written(tmp_path):
    """make train ARGS="run_dir=runs/<a sweep>" """
    from analysis.export import export_sweep
    from tests.analysis.synthetic import write_fake_sweep

    sweep = write_fake_sweep(tmp_path / "runs" / "my-sweep", alphas=(0.0, 0.5), seeds=(1,), n_steps=4)
    export_sweep(sweep)
    before = {str(path.relative_to(sweep)): path.read_bytes() for path in sorted(sweep.rglob("*")) if path.is_file()}
    assert "metrics.parquet" in before and "sweep.json" in before
    result = run_cli(tiny_overrides(sweep, tmp_path / "sft-cache", steps=1))
    assert result.returncode == 2, result.stderr[-3000:]
    assert (f"error: run_dir = '{sweep}' is not allowed: it is a sweep folder (it holds sweep.json, python -m sweeps' "
            f"record of 2 run(s)), not a run folder; give the run a folder of its own, e.g. "
            f"run_dir={sweep.parent / 'my-sweep-run'}, or resume the sweep's runs with make sweep SWEEP=my-sweep"
            ) in result.stderr
    after = {str(path.relative_to(sweep)): path.read_bytes() for path in sorted(sweep.rglob("*")) if path.is_file()}
    assert after == before  # no train.log, lock, config.yaml or metrics over the sweep's own


def test_an_experiment_choice_that_is_a_path_is_refused_and_nothing_is_written(tmp_path, sft_cache):
    """make train ARGS="experiment=../task/knights_knaves" (composed the task file as the experiment, and trained)"""
    run_dir = tmp_path / "run"
    result = run_cli([*tiny_overrides(run_dir, sft_cache, steps=1), "experiment=../task/knights_knaves"])
    assert result.returncode == 2, result.stderr[-3000:]
    assert ("error: experiment = '../task/knights_knaves' is not allowed: an experiment is the name of a file "
            "conf/experiment/<name>.yaml (a name, not a path); allowed: kk") in result.stderr
    assert not run_dir.exists()


def test_a_run_resumed_at_its_last_step_says_it_completed_with_nothing_left(tmp_path, sft_cache, caplog):
    """make train ARGS="run_dir=<a run stopped after its last checkpoint>" (printed "run completed after step -")"""
    import logging

    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, sft_cache, steps=1)
    assert run(compose_train(overrides)) == 0
    # Stopped after writing its last checkpoint, before its status said completed.
    (run_dir / "status.json").write_text(json.dumps({"state": "interrupted", "step": 1}))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dataflex_rl.tracking.console"):
        assert run(compose_train(overrides)) == 0
    lines = [record.getMessage() for record in caplog.records if record.name == "dataflex_rl.tracking.console"]
    assert lines == ["run completed: it resumed at its last step, nothing was left to train"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert list(read_metrics(run_dir)["step"]) == [0, 1]
