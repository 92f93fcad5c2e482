"""The W&B logger against the real wandb package, offline, inside a temp folder (see conftest.py)."""

from __future__ import annotations

import hashlib
import logging
import math
import os

import numpy as np
import pytest
import wandb

from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, WandbConfig, WandbLogger, build_loggers, run_store, wandb_run_id
from dataflex_rl.tracking.run_store import read_metrics

from dataflex_rl.tracking.wandb_file import read_run
from tests.tracking.identities import make_identity as shared_identity

from . import wandb_records

CONFIG = {"trainer": {"lr": 1e-5, "steps": 3}, "dataflex": {"actuator": {"params": {"alpha": 0.5}}}}
UNAVAILABLE = "the run store still has everything"


def make_identity(run: str = "a0.5-s1") -> RunIdentity:
    return shared_identity(run=run)


def logger_config(mode: str) -> dict:
    return {
        "hist_every": 1,
        "console_every": 10,
        "wandb": {"mode": mode, "project": "p", "entity": None, "tags": ["t"]},
    }


def test_offline_run_has_identity_config_and_the_logged_values(tmp_path):
    identity = make_identity()
    logger = WandbLogger(identity=identity, run_dir=tmp_path, config=CONFIG,
                         settings=WandbConfig(project="p", tags=("t",)))
    run = logger.run
    assert run is not None and logger.active
    assert (run.name, run.group, run.project, run.id) == ("sweep1-a0.5-s1", "sweep1", "p", wandb_run_id(identity))
    assert tuple(run.tags) == ("reweight", "local", "t")
    assert run.settings.mode == "offline"
    assert run.config["trainer"] == {"lr": 1e-5, "steps": 3}
    assert dict(run.config["run_identity"]) == identity.to_dict()
    logger.log_config({**CONFIG, "extra": 1})
    assert run.config["extra"] == 1

    logger.log_metrics(0, {keys.SCORE_MEAN: 0.25, keys.GRAD_NORM: float("nan")})
    logger.log_metrics(1, {keys.SCORE_MEAN: 0.5, keys.GRAD_NORM: 2.0})
    logger.log_histogram(1, keys.HIST_WEIGHT, np.array([0.0, 0.5, 1.0]), np.array([3, 4]))
    logger.close("completed")
    assert logger.run is None

    history = wandb_records.history(wandb_records.run_file(tmp_path, run.id))
    assert history[0][keys.SCORE_MEAN] == 0.25 and math.isnan(history[0][keys.GRAD_NORM])
    assert history[1] == {
        keys.SCORE_MEAN: 0.5,
        keys.GRAD_NORM: 2.0,
        f"{keys.HIST_WEIGHT}/_type": "histogram",
        f"{keys.HIST_WEIGHT}/values": [3, 4],
        f"{keys.HIST_WEIGHT}/bins": [0.0, 0.5, 1.0],
    }


def test_offline_file_carries_group_name_and_job_type_of_the_axes(tmp_path):
    identity = shared_identity(run="a0.5-s1-lr0.0003", axes={"alpha": 0.5, "trainer.lr": 3e-4, "seed": 1})
    logger = WandbLogger(identity=identity, run_dir=tmp_path, config=CONFIG,
                         settings=WandbConfig(project="p"))
    run_id = logger.run.id
    logger.close("completed")
    offline = read_run(wandb_records.run_file(tmp_path, run_id))
    assert (offline.group, offline.name, offline.job_type) == ("sweep1", "a0.5-s1-lr0.0003", "a0.5-lr0.0003")
    assert offline.config["run_identity"]["axes"] == {"alpha": 0.5, "trainer.lr": 3e-4, "seed": 1}


def test_run_id_is_stable_per_sweep_and_run():
    assert wandb_run_id(make_identity()) == wandb_run_id(make_identity())
    assert wandb_run_id(make_identity()) != wandb_run_id(make_identity(run="a0.5-s2"))
    identity = make_identity()
    assert wandb_run_id(identity) == hashlib.sha256(f"{identity.sweep}\0{identity.run}".encode()).hexdigest()[:16]


def test_build_loggers_sends_the_same_numbers_to_both_stores(tmp_path):
    identity = make_identity()
    store = RunStore(tmp_path)
    with build_loggers(logger_config("offline"), store, identity, CONFIG) as loggers:
        loggers.log_config(CONFIG)
        for step in range(3):
            loggers.log_metrics(step, {keys.SCORE_MEAN: step / 4, keys.LR: 1e-5})
    history = wandb_records.history(wandb_records.run_file(tmp_path, wandb_run_id(identity)))
    frame = read_metrics(tmp_path)
    assert [history[step][keys.SCORE_MEAN] for step in range(3)] == frame[keys.SCORE_MEAN].tolist() == [0, 0.25, 0.5]
    assert run_store.read_status(store.run_dir)["state"] == "completed"


def test_init_failure_warns_once_and_the_run_store_is_still_written(tmp_path, monkeypatch, caplog):
    def failing_init(*args, **kwargs):
        raise wandb.errors.CommError("could not reach the server")

    monkeypatch.setattr(wandb, "init", failing_init)
    store = RunStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        loggers = build_loggers(logger_config("offline"), store, make_identity(), CONFIG)
        for step in range(3):
            loggers.log_metrics(step, {"a": float(step)})
            loggers.log_histogram(step, "h", [0.0, 1.0], [step])
        loggers.close()
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("W&B unavailable: wandb.init failed (CommError: could not reach the server)")
    assert warnings[0].endswith(UNAVAILABLE)
    assert read_metrics(tmp_path)["a"].tolist() == [0.0, 1.0, 2.0]
    assert run_store.read_status(store.run_dir)["state"] == "completed"
    assert not (tmp_path / "wandb").exists()


def test_online_without_credentials_warns_and_does_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        logger = WandbLogger(identity=make_identity(), run_dir=tmp_path, config=CONFIG,
                             settings=WandbConfig(mode="online"))
    assert logger.run is None
    assert "online mode needs credentials" in logger.unavailable_reason
    assert UNAVAILABLE in caplog.text
    logger.log_metrics(0, {"a": 1.0})
    logger.close()
    assert not (tmp_path / "wandb").exists()


def test_disabled_creates_nothing(tmp_path):
    store = RunStore(tmp_path / "run")
    loggers = build_loggers(logger_config("disabled"), store, make_identity(), CONFIG)
    assert not any(isinstance(logger, WandbLogger) for logger in loggers.loggers)
    loggers.log_metrics(0, {"a": 1.0})
    loggers.close()
    assert not (tmp_path / "run" / "wandb").exists()
    direct = WandbLogger(identity=make_identity(), run_dir=tmp_path / "direct", config=CONFIG,
                         settings=WandbConfig(mode="disabled"))
    direct.log_metrics(0, {"a": 1.0})
    direct.close()
    assert direct.run is None and not (tmp_path / "direct").exists()


def test_bad_mode_names_key_value_and_allowed_values():
    with pytest.raises(ValueError, match=r"logger.wandb.mode = 'cloud' is not allowed; allowed values: 'offline'"):
        WandbConfig(mode="cloud")


@pytest.mark.parametrize(("before", "after"), [(None, "false"), ("true", "true")])
def test_offline_mode_turns_off_w_and_b_telemetry_unless_the_user_chose(tmp_path, monkeypatch, before, after):
    monkeypatch.setattr(wandb, "init", lambda *args, **kwargs: None)
    if before is None:
        monkeypatch.delenv("WANDB_ERROR_REPORTING", raising=False)
    else:
        monkeypatch.setenv("WANDB_ERROR_REPORTING", before)
    WandbLogger(identity=make_identity(), run_dir=tmp_path, config=CONFIG)
    assert os.environ["WANDB_ERROR_REPORTING"] == after
