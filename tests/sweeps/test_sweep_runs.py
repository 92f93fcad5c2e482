"""Real sweeps through ``python -m sweeps``: tiny runs of the real trainer (or the scripted stand-in where a test
needs control over timing), everything in tmp_path."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pyarrow.parquet as pq
import pytest

from dataflex_rl import keys
from sweeps.cli import main

from .conftest import (
    SCRIPTED_TRAIN,
    read_manifest,
    runs_by_name,
    start_driver,
    tiny_extra,
    wait_for,
)


def sweep_argv(tmp_path, sft_cache, *more: str) -> list[str]:
    return ["alpha=0.5", "seeds=1", "steps=2", "jobs=2", f"root={tmp_path / 'runs'}", "name=demo",
            tiny_extra(sft_cache), *more]


def test_sweep_completes_both_runs_then_skips_them(tmp_path, sft_cache, capsys):
    cached = any(sft_cache.glob("*/done.json"))  # the session's cache, shared with the other real-run tests
    sweep_dir = tmp_path / "runs" / "demo"
    assert main(sweep_argv(tmp_path, sft_cache)) == 0
    output = capsys.readouterr().out
    runs = runs_by_name(sweep_dir)
    assert list(runs) == ["a0.0-s1", "a0.5-s1"]  # the alpha = 0 baseline was added
    for name, entry in runs.items():
        assert (entry["state"], entry["exit_code"], entry["attempts"]) == ("completed", 0, 1)
        assert entry["overrides"][-3:] == [f"run_name={name}", "warm_start=per_seed", "threads=1"]  # 2 cores / 2 jobs
        assert entry["env"] == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VERL_USE_EXTERNAL_PLUGINS": "none"}
        run_dir = sweep_dir / name
        assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
        meta = json.loads((run_dir / "meta.json").read_text())
        assert (meta["sweep"], meta["run"], meta["alpha"], meta["seed"]) == ("demo", name, entry["alpha"], 1)
        accuracy = pq.read_table(run_dir / "metrics.parquet").column(keys.VAL_ACCURACY).to_pylist()
        assert [value for value in accuracy if value is not None]
        assert "=== attempt 1" in (sweep_dir / entry["log"]).read_text()
    manifest = read_manifest(sweep_dir)
    assert manifest["state"] == "completed" and manifest["grid"]["alpha"] == [0.0, 0.5]
    # The SFT warm start ran once before the runs, unless an earlier test had filled the cache.
    assert [w["state"] for w in manifest["warm_starts"]] == ([] if cached else ["completed"])
    assert any(sft_cache.glob("*/done.json"))
    assert "a0.5-s1" in output and "completed" in output and str(sweep_dir) in output
    assert (sweep_dir / "report" / "report.md").is_file()

    log_before = (sweep_dir / "logs" / "a0.5-s1.log").read_text()
    assert main(sweep_argv(tmp_path, sft_cache, "report=false")) == 0
    again = runs_by_name(sweep_dir)
    assert [entry["attempts"] for entry in again.values()] == [1, 1]
    assert (sweep_dir / "logs" / "a0.5-s1.log").read_text() == log_before  # nothing was launched
    assert len(read_manifest(sweep_dir)["invocations"]) == 2
    assert "2 already completed" in capsys.readouterr().out


def sigkill_one_run_then_resume(tmp_path, argv: list[str], wait_until_logged: bool) -> None:
    """Start the sweep, SIGKILL run a0.5-s1's process, check it alone failed, then resume it with the same argv."""
    sweep_dir = tmp_path / "runs" / "demo"
    driver = start_driver(argv, tmp_path)

    def started():
        entry = runs_by_name(sweep_dir).get("a0.5-s1", {}) if (sweep_dir / "sweep.json").exists() else {}
        logged = (sweep_dir / "a0.5-s1" / "metrics.jsonl").exists() or not wait_until_logged
        return entry if entry.get("launch", {}).get("pid") and logged else None

    entry = wait_for(started, what="run a0.5-s1 to start")
    assert entry["state"] == "running"
    os.kill(entry["launch"]["pid"], signal.SIGKILL)
    output, _ = driver.communicate(timeout=300)
    assert driver.returncode == 1, output
    runs = runs_by_name(sweep_dir)
    assert (runs["a0.5-s1"]["state"], runs["a0.5-s1"]["exit_code"]) == ("failed", -signal.SIGKILL)
    assert "SIGKILL" in runs["a0.5-s1"]["error"]
    assert runs["a0.0-s1"]["state"] == "completed"
    assert read_manifest(sweep_dir)["state"] == "failed"
    status = sweep_dir / "a0.5-s1" / "status.json"
    if status.exists():  # the driver turns the dead run's "running" into "failed"
        assert json.loads(status.read_text())["state"] == "failed"

    assert main(argv) == 0
    runs = runs_by_name(sweep_dir)
    assert (runs["a0.5-s1"]["state"], runs["a0.5-s1"]["attempts"]) == ("completed", 2)
    assert runs["a0.0-s1"]["attempts"] == 1
    assert json.loads(status.read_text())["state"] == "completed"


@pytest.mark.slow
def test_a_sigkilled_run_fails_alone_and_the_next_invocation_resumes_it(tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.3")
    argv = ["alpha=0.5", "seeds=1", "steps=4", "jobs=2", f"root={tmp_path / 'runs'}", "name=demo",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false"]
    sigkill_one_run_then_resume(tmp_path, argv, wait_until_logged=True)
    steps = [json.loads(line)["step"]
             for line in (tmp_path / "runs" / "demo" / "a0.5-s1" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # resumed after the last step logged before the kill


@pytest.mark.slow
def test_a_sigkilled_real_run_fails_alone_and_is_resumed(tmp_path, sft_cache):
    sigkill_one_run_then_resume(tmp_path, sweep_argv(tmp_path, sft_cache, "report=false"), wait_until_logged=False)
    assert pq.read_table(tmp_path / "runs" / "demo" / "a0.5-s1" / "metrics.parquet").num_rows == 3  # steps 0-2


def test_sigint_stops_every_run_cleanly_and_the_same_command_resumes(tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.4")
    sweep_dir = tmp_path / "runs" / "stop"
    argv = ["alpha=0.5", "seeds=1", "steps=30", "jobs=2", f"root={tmp_path / 'runs'}", "name=stop",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", "grace_s=20"]
    driver = start_driver(argv, tmp_path)

    def both_logged_a_step():
        return all((sweep_dir / run / "metrics.jsonl").exists() and (sweep_dir / run / "metrics.jsonl").read_text()
                   for run in ("a0.0-s1", "a0.5-s1"))

    wait_for(both_logged_a_step, what="both runs to log a step")
    driver.send_signal(signal.SIGINT)
    output, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130, output
    runs = runs_by_name(sweep_dir)
    assert {entry["state"] for entry in runs.values()} == {"interrupted"}
    assert {entry["exit_code"] for entry in runs.values()} == {130}  # each run stopped itself on SIGTERM
    for name in runs:
        assert json.loads((sweep_dir / name / "status.json").read_text())["state"] == "interrupted"
    stopped_at = {name: len((sweep_dir / name / "metrics.jsonl").read_text().splitlines()) for name in runs}
    assert all(0 < steps < 30 for steps in stopped_at.values())

    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0")
    assert main(argv) == 0
    for name in runs:
        steps = [json.loads(line)["step"] for line in (sweep_dir / name / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 31))  # resumed after the last logged step, none twice


@pytest.mark.slow
def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_runs_of_a_sigkilled_driver_stop_and_the_next_invocation_resumes_them(tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.3")
    sweep_dir = tmp_path / "runs" / "orphans"
    argv = ["alpha=0.5", "seeds=1", "steps=30", "jobs=2", f"root={tmp_path / 'runs'}", "name=orphans",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false"]
    driver = start_driver(argv, tmp_path)
    wait_for(lambda: all((sweep_dir / run / "metrics.jsonl").exists() for run in ("a0.0-s1", "a0.5-s1")),
             what="both runs to log a step")
    driver.kill()
    driver.communicate(timeout=60)
    # No run outlives its driver: each got SIGTERM (PR_SET_PDEATHSIG) and marked itself interrupted.
    wait_for(lambda: all(json.loads((sweep_dir / run / "status.json").read_text())["state"] == "interrupted"
                         for run in ("a0.0-s1", "a0.5-s1")), timeout=120, what="the runs to stop")
    assert {entry["state"] for entry in runs_by_name(sweep_dir).values()} == {"running"}  # as the driver left it
    # A run marks itself interrupted, then exits; until it has, the next invocation rightly refuses to resume it.
    pids = [entry["launch"]["pid"] for entry in runs_by_name(sweep_dir).values()]
    wait_for(lambda: not any(map(_alive, pids)), timeout=60, what="the runs' processes to exit")
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0")
    assert main(argv) == 0
    assert {entry["state"] for entry in runs_by_name(sweep_dir).values()} == {"completed"}


def test_a_bad_alpha_refuses_the_whole_sweep_before_anything_runs(tmp_path, sft_cache, capsys):
    code = main(["alpha=0.25,1.5", "seeds=1", f"root={tmp_path / 'runs'}", "name=bad", tiny_extra(sft_cache)])
    assert code == 2
    error = capsys.readouterr().err
    assert "a1.5-s1" in error and "alpha = 1.5 is not allowed" in error and "[0, 1]" in error
    assert not (tmp_path / "runs").exists()
    assert main(["alpha=0.25", f"root={tmp_path / 'runs'}", "extra=[trainer.no_such_key=1]"]) == 2
    assert "no_such_key" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_every_command_line_and_starts_nothing(tmp_path, capsys):
    code = main(["alpha=0.25", "seeds=1,2", "jobs=2", f"root={tmp_path / 'runs'}", "name=dry", "dry_run=true",
                 tiny_extra(tmp_path / "sft-cache")])
    assert code == 0
    output = capsys.readouterr().out
    for name in ("a0.0-s1", "a0.0-s2", "a0.25-s1", "a0.25-s2"):
        assert f"run_dir={tmp_path / 'runs' / 'dry' / name}" in output
    assert output.count("-m dataflex_rl.local.train") == 6  # 4 runs + a warm start per seed
    assert "OMP_NUM_THREADS=1" in output and "mode=sft" in output
    assert not (tmp_path / "runs").exists()
