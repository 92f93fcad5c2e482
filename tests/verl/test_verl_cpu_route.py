"""The policy-loss route end to end in verl's CPU mode: verl's own trainers (the V0 trainer, ``trainer.use_v1=false``,
and V1's ``sync``) with ``loss_mode=dataflex``, no dataflex trainer mode.

What a step's metrics say: with one update per step and no KL, the first mini-batch's importance ratio is 1, so
verl's token-mean ``actor/pg_loss`` is ``-mean(A_t w_t)`` over the valid tokens, while verl's
``critic/advantages/mean`` is ``mean(A_t)`` of the advantages before the loss reweights them (the route changes
nothing outside the loss). alpha = 0: ``pg_loss == -critic/advantages/mean`` (verl's base loss); AR: they differ.
Each run takes 2-3 minutes on two cores: slow tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import load_histograms, read_meta, read_metrics, read_status

from cpu_mode import prepare_folder, run_verl, write_test_experiment  # noqa: E402  (sibling module on sys.path)
from test_verl_cpu_mode import AR, assert_actor_used_written_advantages, completed_metrics

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The experiment's model, tokenizer and data (a short SFT), shared by the module's runs."""
    return prepare_folder(tmp_path_factory.mktemp("verl_cpu_route"))


def assert_reweighted_in_the_loss(metrics: pd.DataFrame) -> None:
    """AR's weights off 1, mean-normalised, and the loss of the reweighted advantages (see the module docstring)."""
    training = metrics.loc[metrics.index > 0]
    assert (training["critic/score/mean"] > 0).all()
    assert (training["dataflex/weight/std"] > 0).all()
    assert training["dataflex/weight/mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    for step, row in training.iterrows():
        assert row["actor/pg_loss"] != pytest.approx(-row["critic/advantages/mean"], rel=1e-2, abs=1e-6), step


def test_verls_own_v0_command_runs_ar_in_its_loss(prepared, tmp_path):
    """``python -m verl.trainer.main_ppo trainer.use_v1=false <the route's overrides>`` as the command builder writes
    it (docs/verl.md): no dataflex code outside the loss; the mechanism's metrics reach verl's own logger."""
    log = tmp_path / "verl.jsonl"
    run = run_verl(prepared, tmp_path / "v0", dataflex=AR, run_store=False,
                   extra=["trainer_mode=v0", "trainer.logger=[console,file]"],
                   environment={"VERL_FILE_LOGGER_PATH": str(log)})
    assert run.returncode == 0, run.tail()
    steps = {line["step"]: line["data"] for line in map(json.loads, log.open())}
    assert sorted(steps) == [0, 1, 2]
    for step in (1, 2):
        data = steps[step]  # verl prefixes what a policy loss returns with actor/
        assert data["actor/dataflex/weight/std"] > 0 and data["actor/dataflex/active"] == 1.0
        assert data["actor/grad_norm/by_prob/low_prob_share"] > 0
        assert data["actor/pg_loss"] != pytest.approx(-data["critic/advantages/mean"], rel=1e-2, abs=1e-6)
        assert not any(key.startswith("actor/dataflex/hist/") for key in data)  # bins only for the recorder


def test_a_route_sweep_on_the_v0_trainer_records_alpha_zero_as_the_base_loss(tmp_path, monkeypatch):
    """``make sweep BACKEND=verl ... EXTRA=trainer_mode=v0``: the recorder writes each run's store from verl's file
    logger, the report reads them; alpha = 0 is verl's vanilla loss, alpha 0.5 reweights inside it."""
    from sweeps.cli import main as sweep_main

    path = write_test_experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = sweep_main(["backend=verl", f"verl.experiment={path}", "alpha=0.5", "seeds=1", "steps=2", "jobs=1",
                       "extra=[trainer_mode=v0]", f"root={tmp_path / 'runs'}", "name=route"])
    assert code == 0
    sweep = tmp_path / "runs" / "route"
    assert "0.5" in (sweep / "report" / "report.md").read_text()
    baseline, reweighted = (completed_metrics_of(sweep / run) for run in ("a0.0-s1", "a0.5-s1"))
    assert list(baseline.index) == [0, 1, 2] and baseline.loc[[0, 2], keys.VAL_ACCURACY].notna().all()
    assert (baseline.loc[[1, 2], "dataflex/weight/std"] == 0.0).all()
    assert_actor_used_written_advantages(baseline)
    assert_reweighted_in_the_loss(reweighted)
    histograms = load_histograms(sweep / "a0.5-s1")
    weights = histograms[(histograms["name"] == keys.HIST_WEIGHT) & (histograms["step"] == 1)]
    assert sum(weights["counts"].iloc[0]) == reweighted.loc[1, keys.VALID_TOKENS]  # one micro-batch per step here
    meta = read_meta(sweep / "a0.5-s1")
    assert meta["backend"] == "verl" and meta["warm_start"]["design"] == "per_seed"


def completed_metrics_of(run_dir: Path) -> pd.DataFrame:
    assert read_status(run_dir)["state"] == "completed", read_status(run_dir)
    return read_metrics(run_dir).set_index("step")


def test_v1_sync_runs_the_route_with_a_run_store(prepared, tmp_path):
    run = run_verl(prepared, tmp_path / "sync", dataflex=AR, extra=["trainer_mode=sync", "trainer.test_freq=1"])
    metrics = completed_metrics(run)
    assert list(metrics.index) == [0, 1, 2] and metrics[keys.VAL_ACCURACY].notna().all()
    assert_reweighted_in_the_loss(metrics)
    assert {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB} <= set(load_histograms(run.run_dir)["name"])
    assert read_meta(run.run_dir)["mechanism"] == "reweight"
