"""Tier 3: a run record you can trust, through the real entry point (issue 11): no mixed configs on resume, one
writer per run, every failure recorded, refusals that touch nothing."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dataflex_rl import keys
from dataflex_rl.local import trainer as trainer_module
from dataflex_rl.tracking.run_store import RunStore, read_metrics, read_status
from dataflex_rl.local.train import main as train_main
from dataflex_rl.local.train import run

from .conftest import REPO, compose_train, run_cli, tiny_overrides


def interrupted_run(run_dir, sft_cache, steps=2, extra=()) -> list[str]:
    """A run that got to ``steps`` and was then marked interrupted (as a kill followed by the driver's mark)."""
    overrides = tiny_overrides(run_dir, sft_cache, steps=steps) + list(extra)
    assert run(compose_train(overrides)) == 0
    RunStore(run_dir).set_status("interrupted", step=steps)
    return overrides


def files_and_times(run_dir) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}


def test_resume_with_a_different_config_is_refused_naming_the_keys(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    overrides = interrupted_run(run_dir, sft_cache, steps=2)
    before = files_and_times(run_dir)
    # The same run resumed with another alpha and lr (and more steps) would mix two configs in one record.
    changed = overrides + ["trainer.total_steps=4", "dataflex.actuator.params.alpha=0.0", "trainer.lr=0.01"]
    result = run_cli(changed)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "dataflex.actuator.params.alpha: recorded 0.5, now 0.0" in result.stderr
    assert "trainer.lr: recorded" in result.stderr and "now 0.01" in result.stderr
    assert files_and_times(run_dir) == before  # refused before anything was written, train.log included
    assert run(compose_train(changed)) == 2  # the in-process entry refuses the same way
    # Keys that cannot change the numbers may differ, and total_steps may grow: the run is extended.
    assert run(compose_train(overrides + ["trainer.total_steps=3", "logger.console_every=5"])) == 0
    frame = read_metrics(run_dir)
    assert list(frame["step"]) == [0, 1, 2, 3]
    assert read_status(run_dir)["state"] == "completed"
    # A completed run can be extended too; asking for fewer steps is refused.
    assert run(compose_train(overrides + ["trainer.total_steps=4"])) == 0
    assert list(read_metrics(run_dir)["step"]) == [0, 1, 2, 3, 4]
    assert run(compose_train(overrides + ["trainer.total_steps=3"])) == 2


@pytest.mark.slow
def test_two_trainers_on_one_run_dir_one_is_refused_and_steps_stay_unique(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    # Long enough to be still training while the second process starts (about 10 s of imports); stopped below.
    overrides = tiny_overrides(run_dir, sft_cache, steps=2000)
    assert run(compose_train(tiny_overrides(tmp_path / "warm", sft_cache, steps=1))) == 0  # SFT cache ready
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "dataflex_rl.local.train", *overrides], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.jsonl").exists() and time.time() < deadline:
            assert first.poll() is None, first.stderr.read()[-2000:]
            time.sleep(0.05)
        second = run_cli(overrides)
        assert first.poll() is None, "the first trainer ended before the second was refused"
    finally:
        first.send_signal(signal.SIGTERM)  # stops like Ctrl-C: marked interrupted
        first.wait(timeout=300)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"pid {first.pid}" in second.stderr and "another process" in second.stderr
    assert first.returncode == 130 and read_status(run_dir)["state"] == "interrupted", read_status(run_dir)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(len(steps))) and len(steps) >= 1  # each step written once, by one writer


def test_a_corrupt_metrics_file_is_recorded_as_failed_and_a_repaired_retry_works(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    overrides = interrupted_run(run_dir, sft_cache, steps=2)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
    assert run(compose_train(overrides)) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed", status
    assert "metrics.jsonl: line 2 is not a run-store record" in status["error"] and status["traceback"]
    (run_dir / "metrics.jsonl").write_text("".join(lines))  # the error named file and line: the user removes it
    assert run(compose_train(overrides)) == 0
    assert read_status(run_dir)["state"] == "completed"


def test_a_full_disk_is_recorded_as_failed_leaves_no_temp_file_and_a_retry_works(tmp_path, sft_cache, monkeypatch):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, sft_cache, steps=2)
    real_save = trainer_module.torch.save

    def save_on_a_full_disk(state, handle, *args, **kwargs):
        handle.write(b"partial checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer_module.torch, "save", save_on_a_full_disk)
    assert run(compose_train(overrides)) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed" and "No space left on device" in status["error"]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == []  # the temp file went with the failure
    monkeypatch.setattr(trainer_module.torch, "save", real_save)  # space again
    assert run(compose_train(overrides)) == 0
    assert read_status(run_dir)["state"] == "completed" and list(read_metrics(run_dir)["step"]) == [0, 1, 2]


class _SignalOnWrite:
    """A checkpoint file that receives SIGTERM in the middle of ``torch.save``'s zip writes."""

    def __init__(self, handle, at_write: int) -> None:
        self.handle, self.at_write, self.writes = handle, at_write, 0

    def write(self, data):
        self.writes += 1
        if self.writes == self.at_write:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)


def test_a_stop_in_the_middle_of_a_checkpoint_is_interrupted_not_failed(tmp_path, sft_cache, monkeypatch):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, sft_cache, steps=4)
    real_save = trainer_module.torch.save
    saves = []

    def save_stopped_at_step_2(state, handle, *args, **kwargs):
        saves.append(state["step"])
        target = _SignalOnWrite(handle, at_write=3) if state["step"] == 2 else handle
        return real_save(state, target, *args, **kwargs)

    saved_handler = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(trainer_module.torch, "save", save_stopped_at_step_2)
    try:
        assert run(compose_train(overrides)) == 130
    finally:
        signal.signal(signal.SIGTERM, saved_handler)
    status = read_status(run_dir)
    assert status["state"] == "interrupted", status  # torch.save was let finish: no RuntimeError from its zip file
    assert saves == [1, 2] and list(read_metrics(run_dir)["step"]) == [0, 1, 2]
    monkeypatch.setattr(trainer_module.torch, "save", real_save)
    assert run(compose_train(overrides)) == 0  # the step-2 checkpoint is whole: the run resumes from it
    assert read_status(run_dir)["state"] == "completed" and list(read_metrics(run_dir)["step"]) == [0, 1, 2, 3, 4]


def test_a_corrupt_checkpoint_is_named(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    overrides = interrupted_run(run_dir, sft_cache, steps=1)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    assert run(compose_train(overrides + ["trainer.total_steps=2"])) == 1
    status = read_status(run_dir)
    assert status["state"] == "failed"
    assert f"checkpoint {run_dir / 'checkpoints' / 'last.pt'} cannot be read" in status["error"]


@pytest.mark.parametrize(
    ("override", "message"),
    [("trainer.lrr=0.1", "trainer.lrr"), ("task=nope", "nope"), ("dataflex.actuator.params.alpha=2", "alpha = 2")],
)
def test_hydra_level_refusals_exit_2_and_create_nothing(tmp_path, sft_cache, override, message, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    # The command-line entry point in this process (the CLI itself is run by the resume test above).
    monkeypatch.setattr(sys, "argv", ["dataflex_rl.local.train", *tiny_overrides(run_dir, sft_cache), override])
    with pytest.raises(SystemExit) as exited:
        train_main()
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


def test_a_run_writes_a_fingerprint_and_group_readable_files(tmp_path, sft_cache):
    run_dir = tmp_path / "run"
    cache = tmp_path / "sft"  # a fresh SFT cache: built under this umask too
    previous = os.umask(0o022)
    try:
        assert run(compose_train(tiny_overrides(run_dir, cache, steps=1) + ["sft.steps=2"])) == 0
    finally:
        os.umask(previous)
    cached = [path for path in cache.rglob("*") if path.is_file()]
    assert any(path.suffix == ".safetensors" for path in cached)
    for path in cached:
        assert path.stat().st_mode & 0o777 == 0o644, path
    from dataflex_rl.tracking.run_store import config_fingerprint, read_config, read_meta

    assert read_meta(run_dir)["config_fingerprint"] == config_fingerprint(read_config(run_dir))
    for name in ("config.yaml", "meta.json", "status.json", "metrics.parquet", "checkpoints/last.pt"):
        assert (run_dir / name).stat().st_mode & 0o777 == 0o644, name
    assert keys.VAL_ACCURACY in read_metrics(run_dir).columns


def test_a_full_disk_under_a_library_error_is_named_first(tmp_path, sft_cache, monkeypatch):
    run_dir = tmp_path / "run"

    def save_on_a_full_disk(state, handle, *args, **kwargs):  # torch's zip writer wraps the OSError of write(2)
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(handle))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0") from None

    monkeypatch.setattr(trainer_module.torch, "save", save_on_a_full_disk)
    assert run(compose_train(tiny_overrides(run_dir, sft_cache, steps=2))) == 1
    error = read_status(run_dir)["error"]
    assert error.startswith("No space left on device (") and "while: RuntimeError: [enforce fail" in error


def test_a_damaged_sft_cache_is_built_again_before_the_run_uses_it(tmp_path, sft_cache):
    import shutil

    assert run(compose_train(tiny_overrides(tmp_path / "first", sft_cache, steps=1))) == 0
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tinylm.sft import sft_cache_key

    cache = tmp_path / "cache"
    shutil.copytree(sft_cache, cache)  # the session's cache may hold other tests' warm starts too
    config = parse_train_config(compose_train(tiny_overrides(tmp_path / "first", cache, steps=1)))
    entry = cache / sft_cache_key(config.model, config.task, config.sft)
    assert (entry / "done.json").is_file()
    (entry / "model.safetensors").write_bytes(b"\x00" * 16)  # done.json kept: its file hashes no longer match
    run_dir = tmp_path / "run"
    overrides = [item for item in tiny_overrides(run_dir, cache, steps=1)]
    assert run(compose_train(overrides)) == 0
    assert read_status(run_dir)["state"] == "completed" and (entry / "model.safetensors").stat().st_size > 16
