"""A verl CPU-mode sweep on a laptop: one run at a time by default (each run starts its own Ray cluster on every
core, and Ray gives a starting node 30 s), so a busy machine does not fail it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sweeps.cli import load_config, main
from sweeps.sweep_config import available_cores
from sweeps.plan import concurrency


@pytest.mark.parametrize(("arguments", "jobs"), [
    (["verl.experiment=verl_cpu_tiny"], 1),
    (["verl.experiment=verl_cpu_tiny", "jobs=2"], 2),
])
def test_a_verl_cpu_mode_sweep_runs_one_run_at_a_time_unless_jobs_is_given(arguments, jobs):
    config = load_config(["backend=verl", "alpha=0.5", "seeds=1,2", *arguments])[1]
    assert (concurrency(config, 4).jobs, concurrency(config, 4).threads) == (jobs, None)
    assert ("verl's CPU mode" in concurrency(config, 4).note) == (jobs == 1)


def test_other_sweeps_keep_the_core_count_or_every_run_on_a_cluster():
    assert concurrency(load_config(["alpha=0.5", "seeds=1,2"])[1], 4).jobs == min(available_cores(), 4)
    cluster = load_config(["backend=verl", "verl.experiment=verl_cpu_tiny", "launcher=slurm", "alpha=0.5"])[1]
    assert concurrency(cluster, 4).jobs == 4 and "verl's CPU mode" not in concurrency(cluster, 4).note


@pytest.mark.slow
def test_a_two_run_verl_cpu_sweep_passes_beside_a_cpu_hog(tmp_path, monkeypatch):
    """Both cores busy with another job: the default sweep (no JOBS) completes both runs."""
    from dataflex_rl.tracking.run_store import read_status

    from ..verl.cpu_mode import write_test_experiment

    path = write_test_experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        code = main(["backend=verl", f"verl.experiment={path}", "alpha=0.5", "seeds=1", "steps=2", "report=false",
                     f"root={tmp_path / 'runs'}", "name=busy"])
    finally:
        for hog in hogs:
            hog.kill()
    assert code == 0
    for run in ("a0.0-s1", "a0.5-s1"):
        assert read_status(tmp_path / "runs" / "busy" / run)["state"] == "completed"
