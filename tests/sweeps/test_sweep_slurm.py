"""``launcher=slurm`` against a real SLURM: munged, slurmctld and slurmd started on this machine for the session
(:mod:`sweeps.local_slurm`, installed from Debian's packages when missing), and the faults a scheduler deals out:
scancel, requeue (preemption), a time limit, a drained node. No accounting (``sacct``) runs, as on many small
clusters. The scripted stand-in trainer does the fault runs (known steps, SIGTERM marks it interrupted); the first
test sweeps the real local backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dataflex_rl.validation import ConfigError
from sweeps import local_slurm
from sweeps.cli import main

from .conftest import SCRIPTED_TRAIN, runs_by_name, start_driver, tiny_extra, wait_for


def require_slurm() -> None:
    """Skip unless SLURM's daemons are here (installed from Debian's packages when missing, as root)."""
    reason = local_slurm.missing_reason()
    if reason is not None:
        pytest.skip(f"no local SLURM: {reason}")
    try:
        local_slurm.install()
    except RuntimeError as error:  # no package registry here
        pytest.skip(f"no local SLURM: {error}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """A one-node SLURM for this module; ``SLURM_CONF`` points every client (and the driver's children) at it."""
    require_slurm()
    folder = tmp_path_factory.mktemp("slurm")
    conf = local_slurm.start(folder, cpus=2)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield folder
    local_slurm.stop(folder)
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous


def scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout


def job_state(job_id: str) -> str:
    """SLURM's state of a job (array task ``12_0`` included), from ``scontrol show job``."""
    text = scontrol("show", "job", job_id)
    return text.split("JobState=", 1)[1].split()[0]


def argv(tmp_path: Path, *more: str, steps: int = 2) -> list[str]:
    return ["alpha=0.5", "seeds=1", f"steps={steps}", f"root={tmp_path / 'runs'}", "name=hpc",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", "poll_s=0.2",
            "launcher=slurm", "slurm.cpus_per_task=1", "slurm.mem_gb=1", "slurm.partition=debug", *more]


def start_logged_driver(tmp_path: Path, arguments: list[str]) -> tuple[subprocess.Popen, Path]:
    """The sweep driver in the background, its output to a file the test reads while it runs."""
    output = tmp_path / "driver.out"
    with open(output, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "sweeps", *arguments], cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT)
    return driver, output


def logged_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.strip()]


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def job_of(sweep_dir: Path, run: str) -> str:
    return wait_for(lambda: (runs_by_name(sweep_dir).get(run, {}).get("launch") or {}).get("job_id")
                    if (sweep_dir / "sweep.json").exists() else None, what=f"{run}'s job id")


@pytest.mark.slow
def test_a_local_backend_sweep_runs_as_slurm_jobs(slurm, tmp_path, sft_cache, capfd):
    """The real trainer: the SFT warm start and two runs, each a job of the array; no sacct warning."""
    code = main(["alpha=0.5", "seeds=1", "steps=2", f"root={tmp_path / 'runs'}", "name=real", "poll_s=0.2",
                 "launcher=slurm", "slurm.cpus_per_task=1", "slurm.mem_gb=2", tiny_extra(sft_cache)])
    output = capfd.readouterr()
    assert code == 0, output.out[-3000:]
    runs = runs_by_name(tmp_path / "runs" / "real")
    assert {run["state"] for run in runs.values()} == {"completed"}
    job_ids = {run["launch"]["job_id"] for run in runs.values()}
    assert len(job_ids) == 2 and all("_" in job_id for job_id in job_ids)  # tasks of one array
    assert all(job_state(job_id) == "COMPLETED" for job_id in job_ids)
    for run in runs.values():
        assert logged_steps(tmp_path / "runs" / "real" / run["run_dir"]) == [0, 1, 2]
    assert "sacct" not in output.out + output.err


def test_jobs_limits_the_arrays_parallelism_and_the_driver_says_why_a_run_waits(slurm, tmp_path, repo_on_path,
                                                                              monkeypatch, capfd):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.3")
    assert main(argv(tmp_path, "jobs=1", "alpha=0.0,0.5", steps=4)) == 0
    captured = capfd.readouterr()
    out = captured.out
    assert "sacct" not in out + captured.err  # states come from squeue: no accounting, no warnings
    waits = [line for line in out.splitlines() if "waits in the queue: PENDING: JobArrayTaskLimit" in line]
    assert len(waits) == 1, out  # said once, not at every poll
    waiting_run = waits[0].split()[0]
    other = ({"a0.0-s1", "a0.5-s1"} - {waiting_run}).pop()
    lines = out.splitlines()
    # the held run starts only after the other has ended: one job of the array at a time
    assert lines.index(f"completed {other}") < lines.index(f"{waiting_run} is running")


@pytest.mark.slow
def test_scancel_of_a_running_job_is_recorded_once_and_resumed(slurm, tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.3")
    driver = start_driver(argv(tmp_path, steps=30), cwd=tmp_path)
    sweep_dir, run_dir = tmp_path / "runs" / "hpc", tmp_path / "runs" / "hpc" / "a0.5-s1"
    job_id = job_of(sweep_dir, "a0.5-s1")
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(logged_steps(run_dir)) >= 3, what="3 steps")
    subprocess.run(["scancel", job_id], check=True)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 1, out
    ends = [line for line in out.splitlines() if line.startswith("interrupted a0.5-s1")]
    assert len(ends) == 1 and "was cancelled (scancel)" in ends[0], out
    recorded = status(run_dir)
    assert recorded["state"] == "interrupted" and f"SLURM job {job_id} was cancelled" in recorded["error"]
    assert runs_by_name(sweep_dir)["a0.5-s1"]["state"] == "interrupted"
    stopped_at = logged_steps(run_dir)[-1]
    assert 3 <= stopped_at < 30
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0")
    assert main(argv(tmp_path, steps=30)) == 0  # the rerun resumes it: every step once
    assert logged_steps(run_dir) == list(range(1, 31))
    assert status(run_dir)["state"] == "completed"


@pytest.mark.slow
def test_a_requeued_job_is_waited_for_never_submitted_twice_and_resumes_where_it_stopped(
        slurm, tmp_path, repo_on_path, monkeypatch, capsys):
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.3")
    driver, output = start_logged_driver(tmp_path, argv(tmp_path, steps=20))
    sweep_dir, run_dir = tmp_path / "runs" / "hpc", tmp_path / "runs" / "hpc" / "a0.5-s1"
    job_id = job_of(sweep_dir, "a0.5-s1")
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and len(logged_steps(run_dir)) >= 3, what="3 steps")
    scontrol("requeue", job_id)  # preemption: SIGTERM now, the job queued again (SLURM holds it ~2 minutes)
    wait_for(lambda: "a0.5-s1 waits in the queue: PENDING: BeginTime" in output.read_text(), what="the wait")
    assert status(run_dir)["state"] == "interrupted"  # the run kept its checkpoint on SIGTERM
    assert "interrupted a0.5-s1" not in output.read_text()  # the driver knows the job is not over
    driver.kill()  # the login session ends; the job stays queued
    driver.wait()
    assert main(argv(tmp_path, steps=20)) == 2  # a rerun launches no second job for it
    assert "still running from an earlier invocation" in capsys.readouterr().err
    scontrol("update", f"JobId={job_id}", "StartTime=now")  # let SLURM start it again at once
    wait_for(lambda: job_state(job_id) == "COMPLETED", what="the requeued job completing")
    assert logged_steps(run_dir) == list(range(1, 21))  # resumed after its last step: none lost, none twice
    assert status(run_dir)["state"] == "completed"
    assert main(argv(tmp_path, steps=20)) == 0  # the next driver counts it completed, launching nothing
    assert runs_by_name(sweep_dir)["a0.5-s1"]["attempts"] == 1


@pytest.mark.slow
def test_a_job_that_reaches_its_time_limit_is_recorded_so_and_resumes(slurm, tmp_path, repo_on_path, monkeypatch):
    """USR2 comes 20 s before the 1-minute limit: the run stops at a step, keeps it, and says why."""
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0.5")
    assert main(argv(tmp_path, "slurm.timeout_min=1", steps=400)) == 1
    run_dir = tmp_path / "runs" / "hpc" / "a0.5-s1"
    recorded = status(run_dir)
    assert recorded["state"] == "interrupted"
    assert "reached its time limit (slurm.timeout_min=1)" in recorded["error"]
    stopped_at = logged_steps(run_dir)[-1]
    assert 10 <= stopped_at < 400 and recorded["step"] == stopped_at
    monkeypatch.setenv("SCRIPTED_TRAIN_STEP_S", "0")
    assert main(argv(tmp_path, "slurm.timeout_min=1", steps=400)) == 0
    assert logged_steps(run_dir) == list(range(1, 401))


@pytest.mark.slow
def test_a_drained_node_is_named_as_the_reason_to_wait_and_a_cancelled_pending_job_is_recorded(
        slurm, tmp_path, repo_on_path, capsys):
    node = scontrol("show", "nodes").split("NodeName=", 1)[1].split()[0]
    scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason=maintenance")
    try:
        driver, output = start_logged_driver(tmp_path, argv(tmp_path))
        sweep_dir = tmp_path / "runs" / "hpc"
        job_id = job_of(sweep_dir, "a0.5-s1")
        wait_for(lambda: output.read_text().count("waits in the queue: PENDING: Nodes required") == 2,
                 what="the driver saying why both runs wait")
        subprocess.run(["scancel", job_id.split("_")[0]], check=True)  # the whole array: both runs
        driver.wait(timeout=60)
        out = output.read_text()
    finally:
        scontrol("update", f"NodeName={node}", "State=RESUME")
    assert driver.returncode == 1
    for run in ("a0.0-s1", "a0.5-s1"):
        assert f"{run} waits in the queue: PENDING: Nodes required for job are DOWN, DRAINED" in out
        assert out.count(f"interrupted {run}: SLURM job ") == 1 and "was cancelled (scancel)" in out
        assert not (sweep_dir / run / "status.json").exists()  # it never started: no run store claims otherwise
    assert main(argv(tmp_path)) == 0  # the node is back: the rerun runs them
    assert logged_steps(sweep_dir / "a0.5-s1") == [1, 2]


@pytest.mark.slow
def test_a_verl_cpu_mode_run_as_a_slurm_job(slurm, tmp_path, monkeypatch):
    """verl's real trainer in its CPU mode (its own Ray cluster inside the job), one run as one SLURM job."""
    from dataflex_rl.tracking.run_store import read_status

    from ..verl.cpu_mode import write_test_experiment

    path = write_test_experiment(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["backend=verl", f"verl.experiment={path}", "alpha=0.0", "seeds=1", "steps=2", "report=false",
                 f"root={tmp_path / 'runs'}", "name=verl", "launcher=slurm", "slurm.cpus_per_task=2",
                 "slurm.mem_gb=12"])
    assert code == 0
    run = runs_by_name(tmp_path / "runs" / "verl")["a0.0-s1"]
    assert run["state"] == "completed" and job_state(run["launch"]["job_id"]) == "COMPLETED"
    assert read_status(tmp_path / "runs" / "verl" / "a0.0-s1")["state"] == "completed"


def test_the_time_limit_signal_comes_a_tenth_of_the_limit_early_within_20_to_90_seconds():
    from sweeps.launchers.slurm import _executor_parameters, signal_margin_s
    from sweeps.launchers.slurm import SlurmSettings

    assert [signal_margin_s(minutes) for minutes in (1, 3, 5, 10, 15, 1440)] == [20, 20, 30, 60, 90, 90]
    assert _executor_parameters(SlurmSettings(timeout_min=5), "s", 2)["slurm_signal_delay_s"] == 30


def test_squeue_lines_are_read_per_array_task(monkeypatch):
    from sweeps.launchers import slurm as launcher

    listing = "12_0|RUNNING|None\n12_1|PENDING|JobArrayTaskLimit\n13|CANCELLED|None\n"

    def fake_run(command, **kwargs):
        assert command[:2] == ["squeue", "--me"] and "--states=all" in command
        return subprocess.CompletedProcess(command, 0, stdout=listing, stderr="")

    monkeypatch.setattr(launcher.subprocess, "run", fake_run)
    queue = launcher.SlurmQueue()
    assert queue.get("12_1") == ("PENDING", "JobArrayTaskLimit") and queue.get("13") == ("CANCELLED", "None")
    assert queue.get("14") is None and queue.problem is None
    monkeypatch.setattr(launcher.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(
        command, 1, stdout="", stderr="slurm_load_jobs error: Unable to contact slurm controller"))
    queue.refresh()
    assert queue.problem.startswith("slurm_load_jobs error") and queue.get("12_0") == ("RUNNING", "None")


def daemons_of(folder: Path) -> dict[int, str]:
    """pid -> name of the SLURM and munge daemons whose command line names ``folder``, found from /proc alone."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError):
            continue
        if argv[0] in local_slurm.DAEMONS and any(str(folder.resolve()) in arg for arg in argv):
            found[int(entry.name)] = argv[0]
    return found


def test_stop_never_signals_the_process_a_stale_pid_file_names(tmp_path):
    """The pid files of a cluster long gone name a process of someone else by now: it lives on."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "munge").mkdir()
        for pid_file in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            (tmp_path / pid_file).write_text(f"{bystander.pid}\n")
        assert local_slurm.main(["stop", "--dir", str(tmp_path)]) == 0
        with pytest.raises(subprocess.TimeoutExpired):
            bystander.wait(timeout=1)
    finally:
        bystander.kill()
        bystander.wait()


def test_start_with_bad_arguments_is_refused_before_anything_starts(tmp_path, capsys):
    folder, a_file = tmp_path / "cluster", tmp_path / "a-file"
    try:
        assert local_slurm.main(["start", "--dir", str(folder), "--cpus", "-2"]) == 2
        assert "--cpus = -2 is not allowed: it must be an integer >= 1" in capsys.readouterr().err
        assert not folder.exists() and daemons_of(folder) == {}  # no munged left behind
        cpus = os.cpu_count()  # slurmd drains a node said to have more: the start timed out after 30 s
        assert local_slurm.main(["start", "--dir", str(folder), "--cpus", str(cpus + 1)]) == 2
        assert f"--cpus = {cpus + 1} is not allowed: it must be an integer in [1, {cpus}]" in capsys.readouterr().err
        assert not folder.exists()
    finally:
        local_slurm.stop(folder)
    a_file.write_text("kept\n")
    assert local_slurm.main(["start", "--dir", str(a_file)]) == 2
    assert f"--dir {a_file} is not allowed: it is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "kept\n"
    spaced = tmp_path / "my cluster"  # slurm.conf cut its paths at the space: slurmctld failed to parse it
    assert local_slurm.main(["start", "--dir", str(spaced)]) == 2
    assert "cannot hold whitespace, '#' or '='" in capsys.readouterr().err and not spaced.exists()


def test_start_twice_on_one_folder_is_refused_and_stop_leaves_none_of_its_daemons(tmp_path, capsys):
    require_slurm()
    folder = tmp_path / "cluster"
    try:
        local_slurm.start(folder, cpus=1)
        first, conf = daemons_of(folder), (folder / "slurm.conf").read_text()
        assert sorted(first.values()) == ["munged", "slurmctld", "slurmd"]
        assert local_slurm.main(["start", "--dir", str(folder), "--cpus", "1"]) == 2
        assert "its local SLURM runs (slurmd pid" in capsys.readouterr().err
        assert daemons_of(folder) == first and (folder / "slurm.conf").read_text() == conf  # not restarted
    finally:
        local_slurm.stop(folder)
    assert daemons_of(folder) == {}


def test_a_start_that_fails_stops_the_daemons_it_started(tmp_path, monkeypatch):
    require_slurm()
    folder = tmp_path / "cluster"
    written = local_slurm.slurm_conf
    monkeypatch.setattr(local_slurm, "slurm_conf", lambda *args: written(*args) + "NoSuchKey=1\n")  # slurmctld fails
    try:
        with pytest.raises(subprocess.CalledProcessError, match="slurmctld"):
            local_slurm.start(folder, cpus=1)
        assert daemons_of(folder) == {}  # munged, started first, is stopped again
    finally:
        local_slurm.stop(folder)


def test_a_job_request_no_node_can_hold_is_refused_naming_the_key(slurm, tmp_path, repo_on_path, capsys):
    """More memory than the node has: sbatch refused every job and the driver sent the reader to a log holding only
    its header. Now the driver refuses before anything starts, naming the key and the most it may be."""
    assert main(argv(tmp_path, "slurm.mem_gb=100000")) == 2
    error = capsys.readouterr().err
    assert "slurm.mem_gb = 100000 is not allowed: no node of partition debug has that much memory" in error
    assert "nothing was started" in error and "allowed: at most " in error
    assert not (tmp_path / "runs" / "hpc" / "logs").exists()
    for setting, refusal in (("slurm.cpus_per_task=3", "slurm.cpus_per_task = 3 is not allowed: no node of "
                                                       "partition debug has that many CPUs; allowed: at most 2"),
                             ("slurm.partition=gpu", "slurm.partition = 'gpu' is not allowed: this cluster's "
                                                     "partitions: debug")):
        assert main(argv(tmp_path, setting)) == 2
        assert refusal in capsys.readouterr().err


def test_a_job_sbatch_refuses_has_sbatchs_reason_in_its_log(slurm, tmp_path, repo_on_path, monkeypatch):
    from sweeps.launchers import slurm as launcher

    monkeypatch.setattr(launcher, "check_request", lambda settings: None, raising=False)  # a refusal not foreseen
    assert main(argv(tmp_path, "slurm.mem_gb=100000")) == 1
    log = (tmp_path / "runs" / "hpc" / "logs" / "a0.5-s1.log").read_text()
    assert "the job was not submitted: " in log and "Memory specification can not be satisfied" in log


def test_a_memory_request_that_would_reach_sbatch_as_0_mb_is_refused():
    """submitit writes a fractional mem_gb as whole MB, and SLURM reads --mem=0 as all of a node's memory."""
    from submitit.slurm.slurm import _convert_mem

    from sweeps.launchers.slurm import SlurmSettings

    assert (_convert_mem(0.0005), _convert_mem(1 / 1024)) == ("0MB", "1MB")
    for value in (0.0005, 0, -1):
        with pytest.raises(ConfigError, match=rf"slurm.mem_gb = {value!r} is not allowed: it must be at least 1 MB"):
            SlurmSettings(mem_gb=value)
    assert SlurmSettings(mem_gb=1 / 1024).mem_gb == 1 / 1024
