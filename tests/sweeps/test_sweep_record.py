"""A sweep name stands for one set of settings (issue 11): a rerun with other overrides is refused naming the keys;
more seeds or alphas with the same overrides grow the sweep; a damaged sweep.json is named."""

from __future__ import annotations

import json

import pytest

from sweeps.cli import main
from sweeps.manifest import Manifest, ManifestError, SweepMismatchError

from .conftest import SCRIPTED_TRAIN, read_manifest, runs_by_name


def scripted_argv(tmp_path, *more: str) -> list[str]:
    return ["steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=c1", f"train_module={SCRIPTED_TRAIN}",
            "local.sft_warm_start=false", "report=false", *more]


def test_rerunning_a_sweep_name_with_other_overrides_is_refused_naming_the_keys(tmp_path, repo_on_path, capsys):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1", "extra=[trainer.val_every=1]")) == 0
    before = (sweep_dir / "sweep.json").read_text()
    capsys.readouterr()
    code = main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1", "extra=[trainer.val_every=1 trainer.lr=0.5]"))
    error = capsys.readouterr().err
    assert code == 2
    assert "config trainer.lr: recorded 0.0001, now 0.5" in error and "sweep c1" in error
    assert (sweep_dir / "sweep.json").read_text() == before  # no command line was rewritten
    code = main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1", "steps=3", "extra=[trainer.val_every=1]"))
    assert code == 2 and "steps: recorded 2, now 3" in capsys.readouterr().err


def test_more_seeds_and_alphas_with_the_same_overrides_grow_the_sweep(tmp_path, repo_on_path, capsys):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1", "extra=[trainer.val_every=1]")) == 0
    fingerprint = read_manifest(sweep_dir)["fingerprint"]
    capsys.readouterr()
    assert main(scripted_argv(tmp_path, "alpha=0.5,1.0", "seeds=1,2", "extra=[trainer.val_every=1]")) == 0
    assert "(2 already completed)" in capsys.readouterr().out
    runs = runs_by_name(sweep_dir)
    assert sorted(runs) == ["a0.0-s1", "a0.0-s2", "a0.5-s1", "a0.5-s2", "a1.0-s1", "a1.0-s2"]
    assert all(entry["state"] == "completed" for entry in runs.values())
    assert runs["a0.5-s1"]["attempts"] == 1  # the first runs were not run again
    assert read_manifest(sweep_dir)["fingerprint"] == fingerprint


def test_a_truncated_sweep_json_is_named(tmp_path, repo_on_path, capsys):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1")) == 0
    text = (sweep_dir / "sweep.json").read_text()
    (sweep_dir / "sweep.json").write_text(text[: len(text) // 2])
    capsys.readouterr()
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1")) == 2
    error = capsys.readouterr().err
    assert f"{sweep_dir / 'sweep.json'} is not valid JSON" in error and "cut short" in error
    with pytest.raises(ManifestError, match="sweep.json is not valid JSON"):
        Manifest(sweep_dir, {"sweep": "c1"})


def test_a_sweep_json_with_another_backend_is_refused(tmp_path):
    header = {"sweep": "c1", "backend": "local", "steps": 2, "grid": {"common_overrides": ["++trainer.lr=0.5"]}}
    Manifest(tmp_path, header).save()
    with pytest.raises(SweepMismatchError, match=r"backend: recorded 'local', now 'verl'"):
        Manifest(tmp_path, {**header, "backend": "verl"})


def _hold_run_lock(run_dir):
    """A live process that writes ``run_dir`` (holds its lock, status running), as a trainer started by hand does."""
    import subprocess
    import sys

    code = ("import sys, time; from dataflex_rl.tracking.run_store import RunStore; store = RunStore(sys.argv[1]); "
            "lock = store.lock(); store.set_status('running', step=1); print('locked', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_run_written_by_another_live_process_is_left_to_it(tmp_path, repo_on_path, capsys):
    sweep_dir = tmp_path / "runs" / "c1"
    holder = _hold_run_lock(sweep_dir / "a0.5-s1")
    try:
        status_before = (sweep_dir / "a0.5-s1" / "status.json").read_text()
        assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1")) == 2
        error = capsys.readouterr().err
        assert f"run a0.5-s1: run {sweep_dir / 'a0.5-s1'} is being written by another process (pid {holder.pid})" \
            in error
        assert (sweep_dir / "a0.5-s1" / "status.json").read_text() == status_before
        assert not (sweep_dir / "a0.0-s1").exists()  # refused before anything started
    finally:
        holder.kill()
        holder.wait()


def test_the_driver_never_marks_a_run_store_another_process_holds(tmp_path):
    from sweeps.runner import mark_run_store

    run_dir = tmp_path / "run"
    holder = _hold_run_lock(run_dir)
    try:
        before = (run_dir / "status.json").read_text()
        message = mark_run_store(run_dir, "failed", "process exited with code 2")
        assert f"being written by another process (pid {holder.pid})" in message
        assert (run_dir / "status.json").read_text() == before
    finally:
        holder.kill()
        holder.wait()
    assert mark_run_store(run_dir, "failed", "process exited with code 2") is None  # the holder is gone
    assert json.loads((run_dir / "status.json").read_text())["state"] == "failed"


@pytest.mark.parametrize(("more", "change"), [
    (("alpha=0.0,0.5", "extra=[trainer.lr=1e-4,3e-4]"), "new axis trainer.lr"),
    (("mechanisms=lopti", "extra=[]"), "new axis mechanisms; axis alpha dropped"),
])
def test_growing_a_sweep_with_a_new_axis_is_refused_naming_it(tmp_path, repo_on_path, capsys, more, change):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.0,0.5", "seeds=1,2")) == 0
    before = (sweep_dir / "sweep.json").read_text()
    capsys.readouterr()
    assert main(scripted_argv(tmp_path, "seeds=1,2", *more)) == 2
    error = capsys.readouterr().err
    assert f"sweep c1 was run along the axes alpha (and seed); now: {change}" in error
    assert (sweep_dir / "sweep.json").read_text() == before
    assert sorted(path.name for path in sweep_dir.iterdir() if path.name.startswith("a")) == [
        "a0.0-s1", "a0.0-s2", "a0.5-s1", "a0.5-s2"]  # no run of the new design started


def test_a_rerun_is_compared_on_resolved_configs_as_a_resume_is(tmp_path, repo_on_path, capsys):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1", "extra=[trainer.val_every=1]")) == 0
    fingerprint = read_manifest(sweep_dir)["fingerprint"]
    assert read_manifest(sweep_dir)["grid"]["common_config"]["trainer.val_every"] == 1
    # a logger setting and a restated default do not change the numbers: the same sweep, resumed
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1,2", "extra=[trainer.val_every=1 "
                                                                  "logger.wandb.mode=offline trainer.lr=1e-4]")) == 0
    assert "(2 already completed)" in capsys.readouterr().out
    assert read_manifest(sweep_dir)["fingerprint"] == fingerprint


def test_a_run_marked_after_a_kill_keeps_its_last_logged_step(tmp_path):
    from dataflex_rl.tracking.run_store import RunStore
    from sweeps.runner import mark_run_store

    store = RunStore(tmp_path / "run")
    store.set_status("running", step=0)
    for step in range(1, 20):
        store.log_metrics(step, {"val/accuracy": 0.5})
    store.detach()  # as a SIGKILL leaves it: no end written
    mark_run_store(tmp_path / "run", "failed", "process ended by signal SIGKILL")
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (status["state"], status["step"]) == ("failed", 19)


@pytest.mark.parametrize("damaged", ["status.json", "meta.json"])
def test_a_completed_run_with_a_damaged_record_is_not_counted_as_completed(tmp_path, repo_on_path, capsys, damaged):
    sweep_dir = tmp_path / "runs" / "c1"
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1")) == 0
    (sweep_dir / "a0.5-s1" / damaged).write_text('{"state": "compl')
    before = (sweep_dir / "sweep.json").read_text()
    capsys.readouterr()
    assert main(scripted_argv(tmp_path, "alpha=0.5", "seeds=1")) == 2
    error = capsys.readouterr().err
    assert ("sweep refused, nothing was started: run a0.5-s1 is not counted as completed, its record cannot be "
            f"trusted: unreadable {damaged} ({sweep_dir / 'a0.5-s1' / damaged}") in error
    assert f"move {sweep_dir / 'a0.5-s1'} away" in error
    assert (sweep_dir / "sweep.json").read_text() == before  # nothing was started or recorded
    assert (sweep_dir / "a0.5-s1" / damaged).read_text() == '{"state": "compl'
