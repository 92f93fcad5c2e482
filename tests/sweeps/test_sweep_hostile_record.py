"""Full disks, odd paths and encodings end in a clear record, and the driver's messages tell the truth (issue: the
record under hostile use, families 4 and 7)."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.identity import RunIdentity
from dataflex_rl.tracking.run_store import RunStore, status as status_module
from dataflex_rl.validation import ConfigError
from sweeps import runner
from sweeps.cli import load_config, main
from sweeps.grid import expand_grid
from sweeps.launchers.process import ProcessLauncher

from .conftest import SCRIPTED_TRAIN, read_manifest, wait_for

IDENTITY = RunIdentity(sweep="s", run="r", backend="local", mechanism="reweight", alpha=0.5, seed=1, config_hash="c")


def test_a_disk_full_at_a_runs_first_write_still_leaves_a_failed_status(tmp_path: Path, monkeypatch) -> None:
    """The disk is full until a file is removed: the run's space reserve, taken before its first write, is what
    lets the failure be recorded."""
    full = {"now": False}
    write = run_store.files.atomic_write_bytes

    def full_disk_write(path, data):
        if full["now"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, data)

    release = status_module.SpaceReserve.release

    def freeing_release(self):
        released = release(self)
        full["now"] = full["now"] and not released
        return released

    monkeypatch.setattr(run_store.files, "atomic_write_bytes", full_disk_write)
    monkeypatch.setattr(status_module.SpaceReserve, "release", freeing_release)
    store = RunStore(tmp_path / "run")
    real_keep = status_module.SpaceReserve.keep

    def keep_then_fill(self):
        real_keep(self)
        full["now"] = True  # the reserve took the last free blocks

    monkeypatch.setattr(status_module.SpaceReserve, "keep", keep_then_fill)
    with pytest.raises(OSError):
        store.write_meta(IDENTITY)
    store.record_error("failed", error="OSError: No space left on device")
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "failed"


def test_a_run_name_whose_launch_file_would_not_fit_a_file_name_is_refused() -> None:
    config = load_config(["alpha=0.5", "seeds=1", f"extra=[task.test_seed={'1' * 236},2]"])[1]
    with pytest.raises(ConfigError, match=r"bytes, a run name at most 250 \(its longest file, launch/<name>.yaml"):
        expand_grid(config)


def test_a_driver_that_fails_mid_sweep_records_the_invocation_failed_not_running(tmp_path, monkeypatch, capsys):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "write_log_header", no_space)
    argv = ["alpha=0.5", "seeds=1", "steps=1", f"root={tmp_path}", "name=full", f"train_module={SCRIPTED_TRAIN}",
            "local.sft_warm_start=false", "validate=false", "report=false", "poll_s=0.05"]
    assert main(argv) == 1
    record = read_manifest(tmp_path / "full")
    assert record["state"] == "failed" and record["invocations"][-1]["exit_code"] == 1
    assert "No space left on device" in capsys.readouterr().err


def test_a_runs_folder_that_cannot_be_written_is_refused_and_nothing_is_left(tmp_path, capsys) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    argv = ["alpha=0.5", "seeds=1", "steps=1", f"root={tmp_path / 'a-file' / 'runs'}", "name=s",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "validate=false"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "cannot be written (Not a directory); give a writable root=<folder>" in error and "Traceback" not in error


def test_a_value_that_is_not_utf8_is_refused_before_any_folder_is_made(tmp_path, capsys) -> None:
    argv = ["alpha=0.5", "seeds=1", f"root={tmp_path}", "name=s", "extra=[trainer.note='caf\udce9']"]
    assert main(argv) == 2
    assert "is not valid UTF-8 (byte 0xe9" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_run_of_an_earlier_driver_is_recognised_by_its_command(tmp_path: Path) -> None:
    config_file = tmp_path / "launch" / "a0.5-s1.yaml"
    command = (sys.executable, "-c", "import time; time.sleep(60)", "--config-file", str(config_file))
    process = subprocess.Popen(command)
    try:
        wait_for(lambda: Path(f"/proc/{process.pid}/cmdline").read_bytes(), what="the process's command line")
        process.send_signal(signal.SIGSTOP)

        class Run:
            name, env, run_dir, log_path = "a0.5-s1", {}, tmp_path / "a0.5-s1", tmp_path / "log"

        Run.command = command
        launcher = ProcessLauncher.__new__(ProcessLauncher)
        assert launcher.still_running({"pid": process.pid}, Run)
        Run.command = (*command[:-1], str(tmp_path / "launch" / "other.yaml"))
        assert not launcher.still_running({"pid": process.pid}, Run)
    finally:
        process.kill()
        process.wait()
