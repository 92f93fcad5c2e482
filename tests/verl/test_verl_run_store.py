"""verl runs in the run store: the ``dataflex_sync`` trainer writes the same run store as the CPU backend, and a
``BACKEND=verl`` sweep folder of such runs gives a report.

The trainer is built as in ``test_verl_trainer.py`` (without ``__init__``, the in-memory TransferQueue) and verl's
``fit`` is replaced by a loop of a few fake steps that calls the trainer's hooks in verl's order: the validation
before training, ``on_train_begin``, then per step the real advantage step (verl's GRPO plus the mechanism) and
``_compute_metrics``, whose verl part is replaced by fixed scores.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest
import yaml
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.tracking import Tracking

from analysis.load import load_sweep
from analysis.report import main as report_main
from dataflex_rl import ConfigError, keys
from dataflex_rl.tracking import config_hash
from dataflex_rl.tracking.run_store import load_histograms, read_metrics
from dataflex_rl.tracking.wandb_file import read_run
from dataflex_rl.verl.run_record import numeric_metrics, run_place
from dataflex_rl.verl.config import mechanism_from_verl_config
from dataflex_rl.verl.trainer import DataflexSyncTrainer

# Sibling test module (tests/verl is on sys.path under pytest's default import mode, as for conftest.py).
from test_verl_trainer import fill_queue, random_rows  # noqa: E402
from tests.tracking import wandb_records

SWEEP = "kk-verl"
STEPS = 3
VAL_KEY = "val-core/knights_knaves/acc/mean@1"
WANDB_VARIABLES = ("WANDB_RUN_GROUP", "WANDB_JOB_TYPE", "WANDB_TAGS")


def fake_score(alpha: float, seed: int, step: int) -> float:
    return 0.1 * step + alpha + 0.01 * seed


class FakeVerl:
    """verl's ``fit`` loop, ``_validate`` and the verl part of ``_compute_metrics``, as fakes (see module doc).

    ``with_wandb``: start verl's own ``Tracking`` with W&B as verl's ``fit`` does (from ``trainer.experiment_name``
    and the environment), log each step to it and finish it; ``self.environment`` keeps the W&B variables it saw.
    """

    def __init__(self, queues, rows, fail_at_step: int | None = None, with_wandb: bool = False) -> None:
        self.queues, self.rows, self.fail_at_step, self.with_wandb = queues, rows, fail_at_step, with_wandb
        self.tracking, self.environment, self.wandb_run_id = None, {}, None

    def fit(self, trainer, agent_loop_manager) -> None:
        if self.with_wandb:
            self.environment = {name: value for name, value in os.environ.items() if name in WANDB_VARIABLES}
            self.tracking = Tracking(project_name=trainer.config.trainer.project_name,
                                     experiment_name=trainer.config.trainer.experiment_name, default_backend="wandb",
                                     config=OmegaConf.to_container(trainer.config, resolve=True))
            self.wandb_run_id = self.tracking.logger["wandb"].run.id
        try:
            self.steps(trainer)
        finally:
            if self.tracking is not None:
                self.tracking.finish()

    def steps(self, trainer) -> None:
        trainer._validate()
        trainer.on_train_begin()
        for step in range(1, STEPS + 1):
            trainer.global_steps = step
            if step == self.fail_at_step:
                raise RuntimeError(f"worker died at step {step}")
            batch = fill_queue(self.queues.new(), self.rows, with_rollout_log_probs=False)
            metrics: dict = {}
            trainer._compute_advantage(batch, metrics=metrics)
            trainer._compute_metrics(batch, metrics, {}, global_steps=step, epoch=0)
            if self.tracking is not None:
                self.tracking.log(data={keys.SCORE_MEAN: metrics[keys.SCORE_MEAN]}, step=step)

    @staticmethod
    def validate(trainer) -> dict:
        return {VAL_KEY: 0.25, "val-aux/num_turns/min": 1}

    @staticmethod
    def compute_metrics(trainer, batch, metrics, timing_raw, global_steps, epoch) -> None:
        alpha = trainer.mechanism.config.actuator.params["alpha"]
        metrics[keys.SCORE_MEAN] = fake_score(alpha, trainer.run_place.seed, global_steps)
        metrics[keys.RESPONSE_LENGTH_MEAN] = 100.0 + global_steps
        metrics["training/epoch"] = epoch
        metrics["dapo_filtered_reward_counts"] = {"0": 3}  # not a number: kept out of the run store


def verl_run(verl_config, queues, monkeypatch, tmp_path, *, alpha, seed, fail_at_step=None, axes=None, fake=None):
    """One fake verl run into ``tmp_path/SWEEP/<run>``; returns the run folder. ``axes``: the grid's axis keys
    (``+dataflex_run.axes``), whose run is named after its cell as the sweep driver names it."""
    name = f"ar-a{alpha:g}-s{seed}" + ("-lr1e-06" if axes else "")
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex = {"mechanism": "reweight", "scorer": {"name": "token_prob"},
                            "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}}}
    verl_config.dataflex_run = {"dir": str(tmp_path / SWEEP / name), "sweep": SWEEP, "name": name,
                                "mechanism_label": "ar", "seed": seed, **({"axes": axes} if axes else {})}
    OmegaConf.set_struct(verl_config, True)
    verl_config.actor_rollout_ref.rollout.n = 4
    fake = fake or FakeVerl(queues, random_rows(seed=seed, prompts=2, group=4), fail_at_step)
    monkeypatch.setattr(PPOTrainerSync, "fit", lambda trainer, agent_loop_manager: fake.fit(trainer, agent_loop_manager))
    monkeypatch.setattr(PPOTrainer, "_validate", fake.validate)
    monkeypatch.setattr(PPOTrainer, "_compute_metrics", fake.compute_metrics)

    trainer = object.__new__(DataflexSyncTrainer)
    trainer.config = verl_config
    trainer.mechanism = mechanism_from_verl_config(verl_config)
    trainer.run_place = run_place(verl_config, trainer.mechanism.config.mechanism)
    trainer.histogram_logger, trainer.global_steps, trainer.timing_raw = None, 0, {}
    if fail_at_step is None:
        trainer.fit(agent_loop_manager=None)
    else:
        with pytest.raises(RuntimeError, match="worker died"):
            trainer.fit(agent_loop_manager=None)
    return tmp_path / SWEEP / name


def test_a_verl_run_writes_the_run_store(verl_config, queues, monkeypatch, tmp_path):
    run_dir = verl_run(verl_config, queues, monkeypatch, tmp_path, alpha=0.5, seed=2)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert {key: meta[key] for key in ("sweep", "run", "backend", "mechanism", "alpha", "seed", "mechanism_label")} \
        == {"sweep": SWEEP, "run": "ar-a0.5-s2", "backend": "verl", "mechanism": "reweight", "alpha": 0.5, "seed": 2,
            "mechanism_label": "ar"}
    assert meta["end_time"] is not None and meta["config_hash"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    # config.yaml is verl's resolved config, beside the values the numbers came from.
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["dataflex"]["actuator"]["params"]["alpha"] == 0.5
    assert config["actor_rollout_ref"]["rollout"]["n"] == 4 and config["mechanism_label"] == "ar"

    metrics = read_metrics(run_dir)
    assert list(metrics["step"]) == [0, 1, 2, 3]  # the validation before training, then the three steps
    assert metrics.loc[0, keys.VAL_ACCURACY] == 0.25 and metrics.loc[0, VAL_KEY] == 0.25
    trained = metrics[metrics["step"] > 0]
    assert list(trained[keys.SCORE_MEAN]) == pytest.approx([fake_score(0.5, 2, step) for step in (1, 2, 3)])
    assert (trained[keys.ACTIVE] == 1.0).all() and (trained[keys.WEIGHT_KEYS[0]] - 1.0).abs().max() < 1e-6
    assert "dapo_filtered_reward_counts" not in metrics.columns
    histograms = load_histograms(run_dir)
    assert sorted(set(histograms["name"])) == [keys.HIST_TOKEN_PROB, keys.HIST_WEIGHT]
    assert sorted(set(histograms["step"])) == [1, 2, 3]


def test_a_failing_verl_run_is_marked_failed_with_its_traceback(verl_config, queues, monkeypatch, tmp_path):
    run_dir = verl_run(verl_config, queues, monkeypatch, tmp_path, alpha=0.5, seed=1, fail_at_step=2)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "failed" and status["step"] == 1
    assert "worker died at step 2" in status["error"] and "Traceback" in status["traceback"]
    assert list(read_metrics(run_dir)["step"]) == [0, 1]  # what was logged before the failure is kept


def test_a_verl_sweep_folder_gives_a_report(verl_config, queues, monkeypatch, tmp_path):
    for alpha in (0.0, 0.5):
        for seed in (1, 2, 3):
            verl_run(verl_config.copy(), queues, monkeypatch, tmp_path, alpha=alpha, seed=seed)
    verl_run(verl_config.copy(), queues, monkeypatch, tmp_path, alpha=0.5, seed=4, fail_at_step=3)
    sweep_dir = tmp_path / SWEEP

    data = load_sweep(sweep_dir)
    included = data.included_runs
    assert len(included) == 6 and set(included["backend"]) == {"verl"}
    assert sorted(set(included["alpha"])) == [0.0, 0.5]
    excluded = data.excluded_runs
    assert list(excluded["run"]) == ["ar-a0.5-s4"] and "worker died" in excluded["exclusion_reason"].iloc[0]

    assert report_main([str(sweep_dir)]) == 0
    report = (sweep_dir / "report" / "report.md").read_text()
    assert keys.SCORE_MEAN in report and "ar-a0.5-s4" in report
    final_window = (sweep_dir / "report" / "table_final_window.csv").read_text()
    assert keys.SCORE_MEAN in final_window


@pytest.fixture
def fresh_wandb_setup():
    """verl opens W&B in a fresh process (its TaskRunner), whose first ``wandb.init`` reads the environment; W&B
    ignores environment changes after its setup, so the test starts, and leaves, without one."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def test_a_verl_run_of_a_grid_records_its_axes_and_names_its_wandb_run_from_them(
    verl_config, queues, monkeypatch, tmp_path, fresh_wandb_setup
):
    """As the local backend: W&B name = the run folder's name, group = the sweep, job_type = the non-seed factors,
    read by verl's own Tracking (real wandb, offline) from what the trainer sets; the environment is restored."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_TAGS", "user-tag")
    monkeypatch.delenv("WANDB_JOB_TYPE", raising=False)
    monkeypatch.setenv("WANDB_RUN_GROUP", "left-as-it-was")
    axes = ["mechanism_label", "dataflex.actuator.params.alpha", "actor_rollout_ref.actor.optim.lr", "seed"]
    fake = FakeVerl(queues, random_rows(seed=2, prompts=2, group=4), with_wandb=True)
    run_dir = verl_run(verl_config, queues, monkeypatch, tmp_path, alpha=0.5, seed=2, axes=axes, fake=fake)

    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["axes"] == {"mechanism_label": "ar", "alpha": 0.5, "actor_rollout_ref.actor.optim.lr": 1e-6, "seed": 2}
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["trainer"]["experiment_name"] == "ar-a0.5-s2-lr1e-06" == run_dir.name
    assert meta["config_hash"] == config_hash(config)  # the hash is that of the config recorded beside it

    assert fake.environment == {"WANDB_RUN_GROUP": SWEEP, "WANDB_JOB_TYPE": "ar-a0.5-lr1e-06",
                                "WANDB_TAGS": "user-tag,reweight,verl"}
    offline = read_run(wandb_records.run_file(pathlib.Path(os.environ["WANDB_DIR"]), fake.wandb_run_id))
    assert (offline.name, offline.group, offline.job_type) == (run_dir.name, SWEEP, "ar-a0.5-lr1e-06")
    assert set(offline.tags) >= {"user-tag", "reweight", "verl"}
    assert offline.config["trainer"]["experiment_name"] == run_dir.name
    assert offline.config["run_identity"]["axes"] == meta["axes"]  # analysis reads seed and factors from W&B too
    from analysis.wandb_runs import load_wandb_offline

    runs = load_wandb_offline(pathlib.Path(os.environ["WANDB_DIR"])).runs
    assert len(runs) == 1 and runs.iloc[0]["seed"] == 2 and runs.iloc[0]["actor_rollout_ref.actor.optim.lr"] == 1e-6
    assert {name: os.environ.get(name) for name in WANDB_VARIABLES} == {
        "WANDB_RUN_GROUP": "left-as-it-was", "WANDB_JOB_TYPE": None, "WANDB_TAGS": "user-tag"}


def test_a_run_outside_a_grid_gets_the_local_backends_wandb_name(verl_config, tmp_path):
    from dataflex_rl.dataflex_block import parse_dataflex_config
    from dataflex_rl.verl.run_record import VerlRunRecord

    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex_run = {"dir": str(tmp_path / "solo"), "sweep": "s", "seed": 3}
    verl_config.dataflex = {"actuator": {"name": "advantage_reweight", "params": {"alpha": 0.25}}}
    dataflex = parse_dataflex_config(verl_config.dataflex)
    record = VerlRunRecord(run_place(verl_config, "reweight"), verl_config, dataflex)
    # the command line gave alpha only; the record holds every value the run used
    assert record.config["dataflex"]["actuator"]["params"] == {"alpha": 0.25, "normalize": "mean", "tau": None,
                                                           "neg_adv_weight": 1.0}
    assert record.identity.wandb_name == "s-a0.25-s3" == record.config["trainer"]["experiment_name"]
    assert record.wandb_environment({}) == {"WANDB_RUN_GROUP": "s", "WANDB_TAGS": "reweight,verl"}
    assert verl_config.trainer.experiment_name != "s-a0.25-s3"  # the record changes its own copy only


def test_without_a_run_dir_no_run_store_is_written(verl_config):
    assert run_place(verl_config, "reweight") is None
    OmegaConf.set_struct(verl_config, False)
    verl_config.dataflex_run = {"dir": "runs/x/y", "colour": "red"}
    with pytest.raises(ConfigError, match="dataflex_run: unknown key\\(s\\) 'colour'; allowed keys: dir, sweep"):
        run_place(verl_config, "reweight")
    verl_config.dataflex_run = {"dir": "runs/x/y"}
    place = run_place(verl_config, "reweight")
    assert (place.name, place.sweep, place.seed, place.mechanism_label) == (
        "y", verl_config.trainer.project_name, verl_config.data.seed, "reweight")


def test_numeric_metrics_keeps_finite_numbers_and_names_the_validation_accuracy():
    import numpy as np
    import torch

    kept = numeric_metrics({"a": 1, "b": np.float32(0.5), "c": torch.tensor(2.0), "d": [1, 2], "e": math.nan,
                            "f": True, "g": torch.ones(3), VAL_KEY: 0.75})
    assert kept == {"a": 1.0, "b": 0.5, "c": 2.0, VAL_KEY: 0.75, keys.VAL_ACCURACY: 0.75}
    two_sources = numeric_metrics({VAL_KEY: 0.5, "val-core/math/acc/mean@1": 0.25})
    assert keys.VAL_ACCURACY not in two_sources  # ambiguous: left to the user
