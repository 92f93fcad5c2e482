"""The driver trusts a run's record only when the run store's check passes it (``run_store.verify_run``): a deleted
run folder is run again, a hand-edited or linked one is refused naming the run, the reason and what to do, and a
sweep name whose folder is a run store is refused before anything is written. The scripted stand-in trainer writes
the same record as the real one."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.analysis.synthetic import write_fake_run
from sweeps.cli import main

from .conftest import SCRIPTED_TRAIN, runs_by_name


def scripted_argv(tmp_path, *more: str) -> list[str]:
    return ["alpha=0.5", "seeds=1", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=c1",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", *more]


def completed_sweep(tmp_path, capsys):
    """``runs/c1`` with runs a0.0-s1 and a0.5-s1 completed."""
    assert main(scripted_argv(tmp_path)) == 0
    capsys.readouterr()
    return tmp_path / "runs" / "c1"


def folder_files(folder) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_deleted_run_folder_is_run_again(tmp_path, repo_on_path, capsys):
    """rm -r runs/c1/a0.5-s1 && make sweep SWEEP=c1 (again)"""
    sweep_dir = completed_sweep(tmp_path, capsys)
    kept = folder_files(sweep_dir / "a0.0-s1")
    shutil.rmtree(sweep_dir / "a0.5-s1")
    assert main(scripted_argv(tmp_path)) == 0
    assert "(1 already completed)" in capsys.readouterr().out
    runs = runs_by_name(sweep_dir)
    assert {name: (entry["state"], entry["attempts"]) for name, entry in runs.items()} == {
        "a0.0-s1": ("completed", 1), "a0.5-s1": ("completed", 2)}
    assert json.loads((sweep_dir / "a0.5-s1" / "status.json").read_text())["state"] == "completed"
    assert folder_files(sweep_dir / "a0.0-s1") == kept  # the other run was not touched


def _edit_config_lr(run_dir) -> str:
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["trainer"]["lr"] = 0.5
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return "config.yaml is not the config the run recorded (its fingerprint is "


def _edit_meta_identity(run_dir) -> str:
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.update(alpha=0.9, seed=2)
    (run_dir / "meta.json").write_text(json.dumps(meta))
    return "meta.json says alpha 0.9, config.yaml says 0.5; meta.json says seed 2, config.yaml says 1"


@pytest.mark.parametrize("edit", [_edit_config_lr, _edit_meta_identity], ids=["config-lr", "meta-alpha-seed"])
def test_a_hand_edited_completed_run_is_refused_naming_the_run(tmp_path, repo_on_path, capsys, edit):
    """edit runs/c1/a0.5-s1/config.yaml (trainer.lr) or meta.json (alpha 0.9, seed 2), then make sweep SWEEP=c1"""
    sweep_dir = completed_sweep(tmp_path, capsys)
    run_dir = sweep_dir / "a0.5-s1"
    reason = edit(run_dir)
    before, record = folder_files(run_dir), (sweep_dir / "sweep.json").read_text()
    assert main(scripted_argv(tmp_path)) == 2
    error = capsys.readouterr().err
    assert ("error: sweep refused, nothing was started: run a0.5-s1 is not counted as completed, its record "
            "cannot be trusted: ") in error
    assert reason in error and f"restore what was changed, or move {run_dir} away" in error
    assert "a0.0-s1" not in error
    assert folder_files(run_dir) == before and (sweep_dir / "sweep.json").read_text() == record


@pytest.mark.parametrize("target", ["other-run", "moved-away"])
def test_a_run_folder_that_is_a_link_is_refused(tmp_path, repo_on_path, capsys, target):
    """mv runs/c1/a0.5-s1 elsewhere (or rm it) && ln -s <a run folder> runs/c1/a0.5-s1 && make sweep SWEEP=c1"""
    sweep_dir = completed_sweep(tmp_path, capsys)
    link = sweep_dir / "a0.5-s1"
    if target == "moved-away":
        pointed = shutil.move(link, tmp_path / "elsewhere")
    else:
        shutil.rmtree(link)
        pointed = sweep_dir / "a0.0-s1"
    link.symlink_to(pointed, target_is_directory=True)
    before, record = folder_files(pointed), (sweep_dir / "sweep.json").read_text()
    assert main(scripted_argv(tmp_path)) == 2
    error = capsys.readouterr().err
    assert (f"run a0.5-s1 is not counted as completed, its record cannot be trusted: the run folder is a symbolic "
            f"link (to {pointed}), not the run's own folder; put the run's own folder at {link}") in error
    assert link.is_symlink() and folder_files(pointed) == before
    assert (sweep_dir / "sweep.json").read_text() == record


def test_a_sweep_name_whose_folder_is_a_run_store_is_refused(tmp_path, repo_on_path, capsys):
    """make train ARGS="run_dir=runs/c1" && make sweep SWEEP=c1"""
    run_dir = write_fake_run(tmp_path / "runs" / "c1", metrics={"val/accuracy": [0.5, 0.6]}, sweep="single",
                             run="c1", alpha=0.5, seed=1)
    before = folder_files(run_dir)
    assert main(scripted_argv(tmp_path)) == 2
    error = capsys.readouterr().err
    assert (f"error: sweep refused, nothing was started: {run_dir} holds a run store (meta.json, status.json: one "
            f"run's folder") in error and "give the sweep another name" in error
    assert folder_files(run_dir) == before
    assert not any((run_dir / name).exists() for name in ("sweep.json", ".sweep.lock", "logs", "launch"))


def test_a_verl_run_without_a_run_store_is_judged_by_its_own_rule(tmp_path):
    """BACKEND=verl runs whose trainer wrote only verl's checkpoints into the run folder (no run store)"""
    from sweeps.runner import record_state

    completed = {"state": "completed", "exit_code": 0}
    run_dir = tmp_path / "a0.5-s1"
    assert record_state(run_dir, True, completed) == (False, [])  # no folder: run it (again)
    (run_dir / "checkpoints").mkdir(parents=True)
    assert record_state(run_dir, True, completed) == (True, [])  # sweep.json's word, for verl's own folder only
    assert record_state(run_dir, True, {"state": "failed", "exit_code": 1}) == (False, [])
    assert record_state(run_dir, False, completed) == (False, ["no status.json", "no meta.json", "no config.yaml"])
    assert record_state(tmp_path / "deleted", False, completed) == (False, [])
