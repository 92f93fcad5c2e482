"""A run the driver launches is composed once in all: the driver composes and validates its config (one Hydra
composition per set of config-group choices, shared by the runs that make them), writes it to
``<sweep>/launch/<run>.yaml``, and the trainer reads that file (``--config-file``) without composing anything."""

from __future__ import annotations

import os
import sys

from hydra._internal.hydra import Hydra

from dataflex_rl.compose import compose_train_config
from dataflex_rl.run_config import read_config_file
from dataflex_rl.tracking.run_store import read_config
from sweeps.cli import main
from tests.counted_train import COUNT_ENV, compositions, counting

from .conftest import runs_by_name, tiny_extra


def test_a_launched_run_and_its_warm_start_are_composed_once_by_the_driver_and_never_by_the_trainer(
        tmp_path, repo_on_path, monkeypatch):
    count = tmp_path / "composed"
    monkeypatch.setenv(COUNT_ENV, str(count))  # the trainers (tests.counted_train) count theirs here
    monkeypatch.setattr(Hydra, "compose_config", counting(Hydra.compose_config, count))  # and the driver its own
    code = main(["alpha=0.5", "seeds=1", "add_baseline=false", "steps=1", f"root={tmp_path / 'runs'}", "name=once",
                 "report=false", "train_module=tests.counted_train", tiny_extra(tmp_path / "sft-cache")])
    assert code == 0
    sweep_dir = (tmp_path / "runs" / "once").resolve()
    composed = compositions(count)
    assert {pid for pid, _ in composed} == {os.getpid()}  # the trainers composed nothing
    # the runs' config groups and the warm starts' (each list's values applied to a copy:
    # sweeps.backends.local.TrainComposer), and the sweep's common settings (sweep.json)
    assert len(composed) == 3

    launch = sweep_dir / "launch" / "a0.5-s1.yaml"
    entry = runs_by_name(sweep_dir)["a0.5-s1"]
    assert entry["state"] == "completed"
    assert entry["command"] == [sys.executable, "-m", "tests.counted_train", "--config-file", str(launch)]
    assert read_config_file(launch) == compose_train_config(entry["overrides"])  # what the run is, on record
    assert read_config(sweep_dir / "a0.5-s1") == read_config_file(launch)  # the run store records the driver's config
    assert (sweep_dir / "launch" / "sft-seed1.yaml").is_file()
    assert "# composed from: " in (sweep_dir / "logs" / "a0.5-s1.log").read_text()
