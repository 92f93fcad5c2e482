"""``launcher=ray`` against a real Ray cluster of a head and a worker node on this machine (:mod:`sweeps.local_ray`,
one CPU each): runs spread over both nodes, and a run whose node is lost mid-run is recorded interrupted with the
reason and resumes on a rerun. The scripted stand-in trainer does the runs; the Ray settings' checks need no cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dataflex_rl.validation import ConfigError
from sweeps import local_ray
from sweeps.cli import main
from sweeps.runner import run_lock_holder

from .conftest import REPO, SCRIPTED_TRAIN, read_manifest, runs_by_name, start_driver, wait_for

STEP_S = 0.3  # each scripted step's sleep, in the nodes' environment (every job inherits it)


def standin_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["alpha=0.0,0.5", "seeds=1", "steps=2", f"root={tmp_path / 'runs'}", "name=scale",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", "poll_s=0.1", "launcher=ray",
            "ray.entrypoint_num_cpus=1", *more]


@pytest.fixture
def ray_cluster(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """A head and a worker node (1 CPU each, resources ``head`` / ``worker1``); yields the cluster's folder and
    state. The GCS declares a silent node dead after 5 failed 1-s health checks (Ray's default: 5 of 3 s, 10 s
    timeout)."""
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the ray CLI is not installed")
    directory = tmp_path_factory.mktemp("ray-cluster")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the sweep's client sends no token, as the cluster wants none
    try:
        yield directory, local_ray.start(directory, workers=1, env={
            "SCRIPTED_TRAIN_STEP_S": str(STEP_S), "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "5", "RAY_health_check_timeout_ms": "1000"})
    finally:
        if (directory / local_ray.STATE_FILE).exists():
            local_ray.stop(directory)


def node_names(address: str) -> dict[str, str]:
    """Node id -> the custom resource naming the node (``head``, ``worker1``)."""
    from ray.util.state import list_nodes

    return {node.node_id: next(name for name in node.resources_total if name in ("head", "worker1"))
            for node in list_nodes(address=address)}


@pytest.mark.slow
def test_ray_launcher_spreads_one_ray_job_per_run_over_two_nodes(tmp_path, ray_cluster, monkeypatch):
    from ray.job_submission import JobStatus, JobSubmissionClient

    address = ray_cluster[1]["address"]
    monkeypatch.setenv("RAY_ADDRESS", address)  # the address comes from the environment here
    assert main(standin_argv(tmp_path)) == 0
    sweep_dir = tmp_path / "runs" / "scale"
    runs = runs_by_name(sweep_dir)
    client, names = JobSubmissionClient(address), node_names(address)
    nodes = {}
    for name, entry in runs.items():
        assert (entry["state"], entry["exit_code"]) == ("completed", 0)
        info = client.get_job_info(entry["launch"]["job_id"])
        assert info.status == JobStatus.SUCCEEDED
        nodes[name] = names[info.driver_node_id]
        assert f"scripted run {name} completed at step 2" in (sweep_dir / "logs" / f"{name}.log").read_text()
    assert sorted(nodes.values()) == ["head", "worker1"]  # one CPU per node: the two runs ran side by side
    assert read_manifest(sweep_dir)["launcher"] == "ray"


def start_on_both_nodes(tmp_path: Path, cluster: dict, steps: int):
    """The sweep's driver in the background, once both runs' jobs run (one per node); (driver, argv, client, node
    names, the worker's run, its run folder) when the worker's run has logged 3 steps."""
    from ray.job_submission import JobSubmissionClient

    argv = standin_argv(tmp_path, f"steps={steps}", f"ray.address={cluster['address']}")
    driver = start_driver(argv, cwd=REPO)
    sweep_dir = tmp_path / "runs" / "scale"
    client, names = JobSubmissionClient(cluster["address"]), node_names(cluster["address"])

    def placed() -> dict[str, str] | None:  # run -> the node running its job, once both jobs have one
        runs = runs_by_name(sweep_dir) if (sweep_dir / "sweep.json").exists() else {}
        ids = {name: (entry.get("launch") or {}).get("job_id") for name, entry in runs.items()}
        if len(ids) < 2 or not all(ids.values()):
            return None
        infos = {name: client.get_job_info(job_id) for name, job_id in ids.items()}
        return {name: names[info.driver_node_id] for name, info in infos.items()} if all(
            info.driver_node_id for info in infos.values()) else None

    nodes = wait_for(placed, what="both jobs placed on a node")
    assert sorted(nodes.values()) == ["head", "worker1"]
    lost = next(name for name, node in nodes.items() if node == "worker1")
    run_dir = sweep_dir / runs_by_name(sweep_dir)[lost]["run_dir"]
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, what="3 steps logged")
    return driver, argv, client, names, lost, run_dir


def logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_whose_ray_node_dies_is_recorded_interrupted_and_resumes(tmp_path, ray_cluster):
    from ray.job_submission import JobStatus

    directory, cluster = ray_cluster
    steps = 40
    driver, argv, client, names, lost, run_dir = start_on_both_nodes(tmp_path, cluster, steps)
    local_ray.kill_node(directory, "worker1")  # SIGKILL its raylet: Ray's fate sharing kills the run's process
    output, _ = driver.communicate(timeout=120)
    assert driver.returncode == 1, output

    sweep_dir = tmp_path / "runs" / "scale"
    job_id = runs_by_name(sweep_dir)[lost]["launch"]["job_id"]
    assert client.get_job_info(job_id).status == JobStatus.FAILED
    reason = f"Ray job {job_id} FAILED: the node running it died"
    assert f"interrupted {lost}: {reason}" in output, output
    entry = runs_by_name(sweep_dir)[lost]
    assert entry["state"] == "interrupted" and reason in entry["error"] and "resumes when the sweep is run again" \
        in entry["error"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "interrupted" and reason in status["error"], status
    assert 3 <= status["step"] == logged_steps(run_dir)[-1] < steps  # the run store names the last step it logged
    assert run_lock_holder(run_dir) is None  # the run's process died with its node: no writer is left
    other = next(name for name in runs_by_name(sweep_dir) if name != lost)
    assert runs_by_name(sweep_dir)[other]["state"] == "completed"

    assert main(argv) == 0  # the rerun resumes the lost run on the head (the worker is gone) from its last step
    entry = runs_by_name(sweep_dir)[lost]
    assert (entry["state"], entry["attempts"]) == ("completed", 2)
    assert names[client.get_job_info(entry["launch"]["job_id"]).driver_node_id] == "head"
    assert logged_steps(run_dir) == list(range(1, steps + 1))
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


@pytest.mark.slow
def test_a_hung_ray_node_whose_run_lives_on_gets_no_second_writer(tmp_path, ray_cluster, capsys):
    directory, cluster = ray_cluster
    steps = 80
    driver, argv, client, names, lost, run_dir = start_on_both_nodes(tmp_path, cluster, steps)
    raylet = local_ray.raylet_pid(directory, "worker1")
    os.kill(raylet, signal.SIGSTOP)  # a hung node: Ray declares it dead, the run's process goes on writing
    sweep_dir = tmp_path / "runs" / "scale"
    wait_for(lambda: runs_by_name(sweep_dir)[lost]["state"] == "interrupted", what="the lost run recorded")
    entry = runs_by_name(sweep_dir)[lost]
    assert "the node running it died" in entry["error"] and "being written by another process" in entry["error"]
    driver.send_signal(signal.SIGTERM)  # stop the sweep (the head's run is interrupted) while the orphan writes
    driver.communicate(timeout=60)
    assert json.loads((run_dir / "status.json").read_text())["state"] == "running"  # left to its live writer
    assert main(argv) == 2  # no second writer: the rerun is refused while the orphan holds the run's lock
    assert f"run {lost}: run {run_dir} is being written by another process" in capsys.readouterr().err
    os.kill(raylet, signal.SIGCONT)  # the raylet learns it was declared dead and exits; its run's process with it
    wait_for(lambda: run_lock_holder(run_dir) is None, timeout=60, what="the orphan's end")
    assert logged_steps(run_dir)[-1] < steps  # it was killed, not finished
    assert main(argv) == 0
    assert logged_steps(run_dir) == list(range(1, steps + 1))
    assert {entry["state"] for entry in runs_by_name(sweep_dir).values()} == {"completed"}


def test_a_ray_cluster_with_token_authentication_is_refused_with_the_fix(tmp_path, monkeypatch, capsys):
    import ray.job_submission

    class TokenCluster:
        def __init__(self, address):
            raise RuntimeError("Authentication required: Unauthorized: Missing authentication token")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", TokenCluster)
    assert main(standin_argv(tmp_path, "ray.address=http://127.0.0.1:8265")) == 2
    error = capsys.readouterr().err
    assert "ray.address = 'http://127.0.0.1:8265' is not allowed" in error
    assert "RAY_AUTH_MODE=token" in error and "RAY_AUTH_TOKEN" in error
    assert not (tmp_path / "runs" / "scale").exists()  # refused before anything was written


def test_a_ray_address_with_spaces_or_newlines_is_refused():
    from sweeps.launchers.ray import RaySettings

    for address in ("http://x:8265\nEVIL", "http://x:8265 ; rm"):
        with pytest.raises(ConfigError, match=r"ray.address = .* is not allowed"):
            RaySettings(address=address)
    for address in ("http://127.0.0.1:8265", "https://ray.example.org/dash", "ray://head:10001", "head:8265"):
        assert RaySettings(address=address).address == address


def processes_with(marker: bytes) -> set[int]:
    """The pids whose environment holds ``marker`` (e.g. a cluster's ``RAY_TMPDIR=...``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def write_state(directory: Path, port: int = 6379) -> dict:
    """A cluster.json as start writes it, of a cluster whose processes are gone (its temp folder made as start
    makes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {"address": "http://127.0.0.1:8265", "gcs_address": f"127.0.0.1:{port}",
             "temp_dir": tempfile.mkdtemp(prefix="ray", dir="/tmp"), "nodes": {"head": {"node_manager_port": 1}}}
    (directory / local_ray.STATE_FILE).write_text(json.dumps(state))
    return state


def test_stop_never_signals_a_process_outside_its_cluster(tmp_path):
    """A process that only mentions the cluster's GCS port in its command line is someone else's: it lives on."""
    state = write_state(tmp_path / "cluster", port=47123)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--to", "127.0.0.1:47123", "x",
                                  state["temp_dir"], "y"])
    try:
        assert local_ray.main(["stop", "--dir", str(tmp_path / "cluster")]) == 0
        with pytest.raises(subprocess.TimeoutExpired):
            bystander.wait(timeout=1)
        assert not Path(state["temp_dir"]).exists() and not (tmp_path / "cluster" / local_ray.STATE_FILE).exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_start_on_a_folder_that_holds_a_cluster_or_is_a_file_is_refused_and_starts_nothing(tmp_path, capsys):
    """A second start on one folder wrote a new cluster.json: stop then stopped the second cluster, never the first."""
    directory, a_file = tmp_path / "cluster", tmp_path / "a-file"
    state = write_state(directory)
    try:
        assert local_ray.main(["start", "--dir", str(directory), "--workers", "0"]) == 2
        assert f"--dir {directory} is not allowed: it holds a cluster already (cluster.json); stop it first" in \
            capsys.readouterr().err
        assert json.loads((directory / local_ray.STATE_FILE).read_text()) == state
    finally:
        local_ray.stop(directory)
    a_file.write_text("kept\n")
    assert local_ray.main(["start", "--dir", str(a_file), "--workers", "0"]) == 2
    assert f"--dir {a_file} is not allowed: it is not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "kept\n"
    for option, value, refusal in (("--workers", "-1", "--workers = -1 is not allowed: it must be an integer >= 0"),
                                   ("--cpus-per-node", "0", "--cpus-per-node = 0.0 is not allowed: it must be > 0")):
        assert local_ray.main(["start", "--dir", str(tmp_path / "other"), option, value]) == 2
        assert refusal in capsys.readouterr().err and not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_second_start_leaves_the_running_cluster_alone_and_stop_leaves_none_of_its_processes(ray_cluster):
    directory, state = ray_cluster
    marker = f"RAY_TMPDIR={state['temp_dir']}".encode()
    before = processes_with(marker)
    assert before
    with pytest.raises(ConfigError, match="holds a cluster already"):
        local_ray.start(directory, workers=0)
    assert local_ray.read_state(directory) == state
    assert local_ray.stop(directory) >= len(before)
    assert processes_with(marker) == set()


def test_a_cluster_json_naming_a_folder_start_did_not_make_is_refused_and_the_folder_kept(tmp_path, capsys):
    """stop deletes the cluster's temp folder: one edited to name the user's folder deleted that folder."""
    directory, precious = tmp_path / "cluster", tmp_path / "results"
    precious.mkdir()
    (precious / "table.csv").write_text("kept\n")
    state = write_state(directory)
    shutil.rmtree(state["temp_dir"])
    (directory / local_ray.STATE_FILE).write_text(json.dumps({**state, "temp_dir": str(precious)}))
    assert local_ray.main(["stop", "--dir", str(directory)]) == 2
    assert f"temp_dir '{precious}' is not a folder `sweeps.local_ray start` made" in capsys.readouterr().err
    assert (precious / "table.csv").read_text() == "kept\n"


def test_kill_never_signals_a_raylet_of_another_cluster(tmp_path, capsys):
    """A stale cluster.json's node port, reused by another cluster's raylet: that raylet lives on."""
    write_state(tmp_path / "cluster")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "raylet",
                                  "--node_manager_port=1"])
    try:
        assert local_ray.main(["kill", "--dir", str(tmp_path / "cluster"), "--node", "head"]) == 2
        assert "node head's raylet is not running" in capsys.readouterr().err
        with pytest.raises(subprocess.TimeoutExpired):
            bystander.wait(timeout=1)
    finally:
        bystander.kill()
        bystander.wait()
        local_ray.stop(tmp_path / "cluster")
