"""The live sweep view: its readers, its ETA, and the whole driver in a pseudo-terminal and without one."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from rich.console import Console

from dataflex_rl.tracking.run_store import JsonlTail
from sweeps.live_view import SFTLogTail, SweepView, format_duration, run_total_steps

from .conftest import REPO, SCRIPTED_TRAIN

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\r")


def test_metrics_tail_reads_only_new_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # no file yet
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x"')
    assert [r["step"] for r in tail.read()] == [1]  # the partial line waits
    with open(path, "a") as handle:
        handle.write(': 2}\n{"step": 3}\n')
    assert [r["step"] for r in tail.read()] == [2, 3]
    assert tail.read() == []
    path.write_text('{"step": 1}\n')  # truncated by a resume: read again from the start
    assert [r["step"] for r in tail.read()] == [1]


def test_sft_log_tail_finds_the_newest_progress_line(tmp_path):
    path = tmp_path / "sft.log"
    path.write_text("=== attempt 1\n[INFO] - SFT step 25/500: loss 1.3\n[INFO] - SFT step 50/500: loss 1.2\n")
    tail = SFTLogTail(path)
    assert tail.read() == (50, 500)
    assert tail.read() is None
    with open(path, "a") as handle:
        handle.write("[INFO] - SFT step 75/5")  # unfinished line: not read yet
    assert tail.read() is None
    with open(path, "a") as handle:
        handle.write("00: loss 1.1\n")
    assert tail.read() == (75, 500)


def test_the_plan_knows_each_runs_steps_and_the_view_falls_back_to_the_run_config(tmp_path):
    from sweeps.backends import get_backend
    from sweeps.cli import load_config
    from sweeps.grid import expand_grid

    def steps_of(*argv):
        config = load_config(["alpha=0.5", "seeds=1", "validate=false", *argv])[1]
        runs = get_backend(config.backend).plan(config, expand_grid(config), "x", tmp_path, threads=1)
        return [run.total_steps for run in runs]

    assert steps_of("steps=7") == [7, 7]
    assert steps_of("local.steps=null", "extra=[trainer.total_steps=12]") == [12, 12]  # the common override's value
    assert steps_of("local.steps=null") == [None, None]  # the trainer's default: read from the run's config
    verl = ["backend=verl", "verl.experiment=verl_cpu_tiny", "dry_run=true"]
    assert steps_of(*verl, "extra=[trainer.total_training_steps=3]") == [3, 3]
    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 400\n")
    assert run_total_steps(tmp_path) == 400
    assert run_total_steps(tmp_path / "missing") is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_eta_from_finished_runs_then_from_step_rates(tmp_path):
    clock = Clock()
    out = io.StringIO()
    view = SweepView(total=4, jobs=2, console=Console(file=out, width=200), clock=clock)
    assert view.plain  # not a terminal
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        view.started(name, tmp_path / name, tmp_path / f"{name}.log", total=10)
    assert view.eta_seconds() is None  # nothing known yet
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    clock.now = 50.0
    view.refresh()
    # before any run ends: run a is half done after 50 s -> 100 s a run; left: a 50 s, b 100 s (no step yet,
    # 100 - 50 elapsed = 50 s), 2 queued x 100 s; over 2 jobs: (50 + 50 + 200) / 2
    assert view.eta_seconds() == 150.0
    clock.now = 80.0
    view.finished("a", "completed")  # 80 s wall
    # b: no step logged, 80 - 80 elapsed = 0 s left; 2 queued x 80 s, over 2 jobs
    assert view.eta_seconds() == 80.0
    assert "1/4 done, 1 running, 0 failed, ETA 1m20s" in out.getvalue()
    assert "a: step 5/10" in out.getvalue()  # the plain milestone line at half way


def test_format_duration():
    assert [format_duration(s) for s in (0.4, 45, 725, 11220)] == ["<1s", "45s", "12m05s", "3h07m"]


def driver_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["alpha=0.0,0.5", "seeds=1", "steps=12", "jobs=1", f"root={tmp_path / 'runs'}", "name=live",
            f"train_module={SCRIPTED_TRAIN}", "validate=false", "report=false", "poll_s=0.05",
            "extra=[sft.steps=4]", *more]


def driver_env(step_seconds: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "SCRIPTED_TRAIN_STEP_S": step_seconds, "COLUMNS": "160"}


def read_pty_until_exit(process: subprocess.Popen, master: int, timeout: float = 120.0) -> bytes:
    """Everything the driver wrote to the pseudo-terminal, in order, until it exits."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its side
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    return b"".join(chunks)


def test_live_view_in_a_pseudo_terminal_shows_progress_before_the_first_run_ends(tmp_path):
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "sweeps", *driver_argv(tmp_path)], cwd=tmp_path,
                               env=driver_env("0.15"), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    try:
        output = read_pty_until_exit(process, master)
    finally:
        os.close(master)
    assert process.returncode == 0, output.decode(errors="replace")
    text = ANSI.sub(b"", output).decode(errors="replace")
    first_end = text.index("completed a0.0-s1")
    before = text[:first_end]
    assert re.search(r"warm start sft\S*\W+[1-4]/4", before)  # the warm start's own progress
    steps_shown = {int(m) for m in re.findall(r"(\d+)/12\b", before)}
    assert steps_shown & set(range(1, 12)), before[-2000:]  # a run's step out of its total, mid-run
    assert re.search(r"runs done\W+0/2\s+1 running, 0 failed", before)
    assert "reward" in before and "acc 0.010" in before  # latest values read from the run store
    assert "ETA" in text[first_end:]
    assert "\x1b[" in output.decode(errors="replace")  # drawn in place, as a terminal view


def test_plain_view_without_a_terminal_prints_one_line_per_event(tmp_path):
    result = subprocess.run([sys.executable, "-m", "sweeps", *driver_argv(tmp_path)], cwd=tmp_path,
                            env=driver_env("0.02"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\x1b[" not in result.stdout  # no terminal codes in a log file
    lines = result.stdout.splitlines()
    first_end = lines.index("completed a0.0-s1")
    assert any(line.strip().startswith("a0.0-s1: step ") and "/12" in line for line in lines[:first_end])
    assert any(line.startswith("progress: 1/2 done, 0 running, 0 failed, ETA") for line in lines)
    assert "progress: 2/2 done, 0 running, 0 failed" in result.stdout
    assert any(line.strip().startswith("warm start sft-seed1: step ") for line in lines), result.stdout  # each line names its warm start
    # report=false: the sweep-level table is still written at the end
    metrics = pd.read_parquet(tmp_path / "runs" / "live" / "metrics.parquet")
    assert set(metrics["run"]) == {"a0.0-s1", "a0.5-s1"} and set(metrics["alpha"]) == {0.0, 0.5}
    assert metrics[metrics["metric"] == "val/accuracy"]["value"].max() == 0.51


def test_the_last_run_past_its_last_step_is_finishing_not_eta_zero(tmp_path):
    clock = Clock()
    view = SweepView(total=1, console=Console(file=io.StringIO()), clock=clock)
    view.started("a", tmp_path, tmp_path / "a.log", total=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    clock.now = 10.0
    view.refresh()
    assert view.counts() == "0/1 done, 1 running, 0 failed, ETA 10s (from step rates)"
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    view.refresh()
    assert view.counts() == "0/1 done, 1 running, 0 failed, finishing"


def test_interrupted_runs_are_counted_and_shown_as_interrupted(tmp_path):
    """make sweep ... then Ctrl-C twice (the progress line said "0 failed" and counted no interrupted run; the closing
    table showed "pending" for a run whose status.json said interrupted at step 15)"""
    from tests.sweeps.conftest import plan_of
    from sweeps.cli import load_config
    from sweeps.manifest import Manifest
    from sweeps.closing import run_table

    out = io.StringIO()
    view = SweepView(total=3, jobs=2, console=Console(file=out, width=200), clock=Clock())
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        view.started(name, tmp_path / name, tmp_path / f"{name}.log", total=10)
    view.finished("a", "interrupted")
    assert view.counts(done=False).startswith("1 running, 0 failed, 1 interrupted")
    assert "progress: 0/3 done, 1 running, 0 failed, 1 interrupted" in out.getvalue()

    config = load_config(["alpha=0.5", "seeds=1,2", "add_baseline=false", "validate=false", f"root={tmp_path}",
                          "name=stopped", "report=false"])[1]
    plan = plan_of(config)
    manifest = Manifest(plan.sweep_dir, plan.header())
    for run in plan.runs:  # as the driver leaves them when a second Ctrl-C stops it at once
        manifest.entry(run.name, {"state": "pending", "exit_code": None})
    stopped = plan.runs[0].run_dir
    stopped.mkdir(parents=True)
    (stopped / "status.json").write_text(json.dumps({"state": "interrupted", "step": 15}))
    before = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    table = io.StringIO()
    Console(file=table, width=200).print(run_table(plan, manifest))
    rows = {line.split()[1]: line for line in table.getvalue().splitlines() if line.startswith("│ a0.5-s")}
    assert "interrupted at step 15" in rows["a0.5-s1"] and "pending" not in rows["a0.5-s1"]
    assert "pending" in rows["a0.5-s2"]  # never started: no run store to say otherwise
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == before  # the table only reads


def test_a_run_waiting_in_a_schedulers_queue_is_counted_queued_and_its_clock_starts_when_it_runs(tmp_path):
    clock = Clock()
    view = SweepView(total=2, jobs=2, console=Console(file=io.StringIO()), clock=clock)
    view.started("a", tmp_path / "a", tmp_path / "a.log", total=2)
    view.started("b", tmp_path / "b", tmp_path / "b.log", total=2)
    view.waiting("b", "PENDING: JobArrayTaskLimit")
    assert view.counts(done=False) == "1 running, 1 queued, 0 failed"
    clock.now = 30.0
    view.waiting("b", None)
    assert view.counts(done=False) == "2 running, 0 failed"
    assert view.active["b"].started == 30.0 and view.active["a"].started == 0.0
