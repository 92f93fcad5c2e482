"""Two-step local runs of each mechanism preset (baseline, ar, lopti, ar_lopti and the token rules) through the real entry point.

A staged mechanism makes the trainer run one full PPO update per stage: the optimiser's step count in the last
checkpoint says how many updates ran (steps x stages x ppo_epochs x ppo_mini_batches; the tiny runs have one epoch
and one mini-batch).
"""

from __future__ import annotations

import math

import pytest
import torch

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import load_histograms, read_metrics
from dataflex_rl.local.train import run

from .conftest import compose_train, tiny_overrides

STEPS = 2


def optimizer_steps(run_dir) -> int:
    """AdamW's step count (the same for every parameter) from ``checkpoints/last.pt``."""
    state = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    counts = {int(param_state["step"]) for param_state in state["optimizer"]["state"].values()}
    assert len(counts) == 1, counts
    return counts.pop()


def run_preset(tmp_path, sft_cache, preset: str, extra: list[str] = ()):
    run_dir = tmp_path / preset
    overrides = tiny_overrides(run_dir, sft_cache, steps=STEPS) + [f"dataflex={preset}", *extra]
    assert run(compose_train(overrides)) == 0
    return run_dir, read_metrics(run_dir).set_index("step")


@pytest.mark.parametrize(
    ("preset", "stages", "alpha"),
    [("baseline", 1, 0.0), ("ar", 1, 0.5), ("lopti", 2, 0.0), ("ar_lopti", 2, 0.5)],
)
def test_two_step_run_per_mechanism(tmp_path, sft_cache, preset, stages, alpha):
    run_dir, frame = run_preset(tmp_path, sft_cache, preset)
    assert optimizer_steps(run_dir) == STEPS * stages
    train = frame.loc[1:STEPS]
    assert (train[keys.ACTIVE] == 1.0).all()
    assert train[keys.PG_LOSS].map(math.isfinite).all()
    if stages == 2:
        # eta = 0.5 is also the threshold of dataflex/token_prob/low_frac, so the two shares agree.
        shares = train[keys.LOPTI_LOW_TOKEN_FRAC]
        assert shares.between(0.0, 1.0).all()
        assert shares.tolist() == pytest.approx(train[keys.TOKEN_PROB_LOW_FRAC].tolist())
    else:
        assert keys.LOPTI_LOW_TOKEN_FRAC not in frame.columns
    # alpha = 0: the weights are exactly 1 on every valid token.
    assert ((train[keys.WEIGHT_KEYS[0]] == 1.0) & (train[f"{keys.WEIGHT_PREFIX}/std"] == 0.0)).all() == (alpha == 0.0)


def test_lopti_stages_only_from_warmup_step(tmp_path, sft_cache):
    run_dir, frame = run_preset(tmp_path, sft_cache, "lopti", ["dataflex.warmup_step=2"])
    assert optimizer_steps(run_dir) == 1 + 2  # step 1: one update; step 2: two
    assert frame.loc[1, keys.ACTIVE] == 0.0 and frame.loc[2, keys.ACTIVE] == 1.0
    assert math.isnan(frame.loc[1, keys.LOPTI_LOW_TOKEN_FRAC]) and frame.loc[2, keys.LOPTI_LOW_TOKEN_FRAC] >= 0.0


def test_lopti_quantile_split_puts_the_share_eta_first(tmp_path, sft_cache):
    # split: quantile (the paper code's seperate_portion): eta = 0.25 is the share of valid tokens updated first.
    run_dir, frame = run_preset(tmp_path, sft_cache, "lopti",
                                ["dataflex.actuator.params.split=quantile", "dataflex.actuator.params.eta=0.25"])
    assert optimizer_steps(run_dir) == STEPS * 2
    train = frame.loc[1:STEPS]
    assert (train[keys.LOPTI_LOW_TOKEN_FRAC] - 0.25).abs().max() < 0.05
    # The threshold is the batch's quantile of pi, not eta itself.
    assert train[keys.LOPTI_THRESHOLD].between(0.0, 1.0).all() and (train[keys.LOPTI_THRESHOLD] != 0.25).all()


@pytest.mark.parametrize(("preset", "reads_entropy"), [("high_entropy", True), ("stapo", True), ("ar_sigmoid", False)])
def test_two_step_run_of_each_token_rule_preset(tmp_path, sft_cache, preset, reads_entropy):
    run_dir, frame = run_preset(tmp_path, sft_cache, preset)
    assert optimizer_steps(run_dir) == STEPS
    train = frame.loc[1:STEPS]
    assert (train[keys.ACTIVE] == 1.0).all() and train[keys.PG_LOSS].map(math.isfinite).all()
    kept = train[keys.KEPT_TOKEN_FRAC]
    if preset == "high_entropy":
        # rho = 0.2 of the tokens, plus ties at the quantile; the loss keeps its normalisation over all tokens.
        assert kept.between(0.2 - 1e-9, 1.0).all() and (kept < 1.0).all()
        assert (train[keys.WEIGHT_KEYS[0]] == kept).all()  # 0/1 weights: their mean is the kept share
    else:
        # STAPO silences a rare few tokens at most (mean weight 1 over valid tokens); the sigmoid drops none.
        assert kept.between(0.9, 1.0).all()
        assert train[keys.WEIGHT_KEYS[0]].to_numpy() == pytest.approx(1.0, abs=1e-5)
    histograms = load_histograms(run_dir)
    assert (keys.HIST_ENTROPY in set(histograms["name"])) == reads_entropy


def test_band_preset_updates_one_quartile_and_logs_how_every_bucket_moved(tmp_path, sft_cache):
    run_dir, frame = run_preset(tmp_path, sft_cache, "band_q1", ["stats.prob_change_every=2"])
    train = frame.loc[1:STEPS]
    # Only tokens with pi < 0.25 keep their advantages: the kept share is the bucket's token share.
    low_share = train[keys.grad_by_prob("0.00-0.25", "token_share")]
    assert train[keys.KEPT_TOKEN_FRAC].tolist() == pytest.approx(low_share.tolist())
    # The probability change is measured at step 2 only (every 2 steps), by advantage sign x bucket.
    correct = frame[keys.PROB_CHANGE_CORRECT_SHARE]
    assert math.isnan(correct.loc[1]) and 0.0 <= correct.loc[2] <= 1.0
    shares = [frame.loc[2, keys.prob_change(sign, label, "token_share")] for sign in keys.ADVANTAGE_SIGNS
              for label in ("0.00-0.25", "0.25-0.50", "0.50-0.75", "0.75-1.00")]
    assert 0.0 < sum(shares) <= 1.0 + 1e-9  # tokens with a non-zero advantage, each in one cell
    assert frame.loc[2, keys.TIMING_PROB_CHANGE] > 0
