"""The recorder of policy-loss route runs (``python -m dataflex_rl.verl.record``): the lines verl's file logger
writes become the run store's steps, with the route's metrics under the trainer modes' names."""

from __future__ import annotations

import torch
import pytest
from omegaconf import OmegaConf

from dataflex_rl import build_mechanism, keys
from dataflex_rl.tracking.run_store import read_status
from dataflex_rl.verl.command import build_verl_command, verl_overrides_of
from dataflex_rl.verl.policy_loss import histogram_bins
from dataflex_rl.verl.record import FileLog, main, resumed_step, route_step

KK = ["model=/models/Qwen2.5-3B-Instruct", "data_dir=/data/kk"]
AR = {"mechanism": "reweight", "actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}}}


def test_a_route_line_becomes_the_run_stores_step():
    fields = {"old_log_probs": torch.log(torch.tensor([[0.1, 0.5, 0.9]])), "advantages": torch.ones(1, 3),
              "response_mask": torch.ones(1, 3, dtype=torch.bool)}
    output = build_mechanism(AR).process(0, fields, histograms=True)
    line = {"actor/pg_loss": -0.1, "actor/dataflex/weight/std": 0.2, "actor/grad_norm/by_prob/low_prob_share": 0.6,
            "critic/advantages/mean": 0.1, **{f"actor/{name}": count
                                               for name, count in histogram_bins(output.histograms).items()}}
    metrics, histograms = route_step(line)
    assert metrics == {"actor/pg_loss": -0.1, "dataflex/weight/std": 0.2, "grad_norm/by_prob/low_prob_share": 0.6,
                       "critic/advantages/mean": 0.1}
    assert set(histograms) == {keys.HIST_WEIGHT, keys.HIST_TOKEN_PROB}
    for name, histogram in output.histograms.items():
        assert (histograms[name].counts == histogram.counts).all() and histograms[name].counts.sum() == 3


def test_the_file_log_gives_each_complete_line_once(tmp_path):
    log = FileLog(tmp_path / "verl.jsonl")
    assert log.new_lines() == []  # verl has not opened it yet
    log.path.write_bytes(b'{"step": 0, "data": {"a": 1}}\n{"step": 1, "da')
    assert log.new_lines() == [{"step": 0, "data": {"a": 1}}]
    with log.path.open("ab") as stream:
        stream.write(b'ta": {"a": 2}}\n')
    assert log.new_lines() == [{"step": 1, "data": {"a": 2}}]
    assert log.new_lines() == []


def test_the_resumed_step_is_verls(tmp_path):
    config = OmegaConf.create({"trainer": {"resume_mode": "auto", "resume_from_path": None,
                                           "default_local_dir": str(tmp_path)}})
    assert resumed_step(config) == 0
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    assert resumed_step(config) == 3
    config.trainer.resume_mode = "disable"
    assert resumed_step(config) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["+dataflex_run.dir=/tmp/never"], "the dataflex trainer modes write their run store themselves"),
     (["trainer_mode=v0"], "dataflex_run.dir: missing; the recorder writes a run store there")],
    ids=["trainer-mode", "no-run-folder"],
)
def test_the_recorder_refuses_what_it_does_not_record(extra, message, capsys):
    assert main(verl_overrides_of(build_verl_command("verl_kk_3b", (), [*KK, *extra]))) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # verl's driver in a fresh process (about 20 s), no Ray: verl refuses the config first
def test_a_verl_failure_ends_the_run_failed_with_verls_output(tmp_path, monkeypatch):
    monkeypatch.setattr("dataflex_rl.verl.record.raise_on_sigterm", lambda: None)  # the test process keeps its own
    run_dir = tmp_path / "run"
    overrides = verl_overrides_of(build_verl_command("verl_kk_3b", (), [
        *KK, "trainer_mode=v0", f"+dataflex_run.dir={run_dir}", "actor_rollout_ref.actor.ppo_mini_batch_size=128"]))
    assert main(overrides) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed" and status["error"] == "VerlExited: verl exited with code 1"
    assert "train_batch_size (64) must be >= actor.ppo_mini_batch_size (128)" in status["traceback"]
