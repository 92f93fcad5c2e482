"""Scale-out launchers (SLURM through submitit's local executor, Ray Jobs against a real local head) and the
verl backend's command lines; the scripted stand-in trainer does the runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dataflex_rl.validation import ConfigError
from sweeps.cli import main

from .conftest import REPO, SCRIPTED_TRAIN, read_manifest, runs_by_name


def standin_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["alpha=0.5", "seeds=1", "steps=2", f"root={tmp_path / 'runs'}", "name=scale",
            f"train_module={SCRIPTED_TRAIN}", "sft_warm_start=false", "report=false", "poll_s=0.1", *more]


def test_slurm_launcher_runs_a_job_array_through_submitit(tmp_path, repo_on_path, monkeypatch):
    monkeypatch.setenv("SCRIPTED_TRAIN_FAIL", "a0.0-s1")
    code = main(standin_argv(tmp_path, "launcher=slurm", "slurm.cluster=submitit_local", "slurm.cpus_per_task=1"))
    assert code == 1  # one run failed on purpose
    sweep_dir = tmp_path / "runs" / "scale"
    runs = runs_by_name(sweep_dir)
    assert (runs["a0.5-s1"]["state"], runs["a0.5-s1"]["exit_code"]) == ("completed", 0)
    assert (runs["a0.0-s1"]["state"], runs["a0.0-s1"]["exit_code"]) == ("failed", 1)
    assert runs["a0.5-s1"]["launch"]["job_id"] and runs["a0.0-s1"]["launch"]["job_id"]
    assert runs["a0.5-s1"]["overrides"][-1] == "threads=1"  # threads = slurm.cpus_per_task
    assert "scripted run a0.5-s1 completed at step 2" in (sweep_dir / "logs" / "a0.5-s1.log").read_text()
    assert (sweep_dir / "submitit").is_dir()
    # The failed run is launched again by the same command; the completed one is not.
    monkeypatch.delenv("SCRIPTED_TRAIN_FAIL")
    assert main(standin_argv(tmp_path, "launcher=slurm", "slurm.cluster=submitit_local", "slurm.cpus_per_task=1")) == 0
    runs = runs_by_name(sweep_dir)
    assert [runs[name]["attempts"] for name in ("a0.0-s1", "a0.5-s1")] == [2, 1]


def test_slurm_launcher_without_sbatch_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    assert main(standin_argv(tmp_path, "launcher=slurm")) == 2
    assert "no sbatch on PATH" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_verl_backend_builds_verl_command_lines_in_a_dry_run(tmp_path, capsys):
    code = main(["backend=verl", "alpha=0.25", "seeds=1", "steps=5", "dry_run=true", f"root={tmp_path / 'runs'}",
                 "name=gpu", "extra=[model=/models/qwen data_dir=/data/kk trainer.n_gpus_per_node=8]"])
    assert code == 0
    output = capsys.readouterr().out
    lines = [line for line in output.splitlines() if "verl.trainer.main_ppo" in line]
    assert len(lines) == 2  # the baseline and alpha = 0.25; no SFT warm start for verl
    line = lines[1]
    assert "WANDB_RUN_GROUP=gpu" in line and "WANDB_JOB_TYPE=a0.25" in line
    assert "-m verl.trainer.main_ppo trainer.v1.trainer_mode=dataflex_sync" in line
    for part in ("+dataflex.actuator.params.alpha=0.25", "actor_rollout_ref.model.path=/models/qwen",
                 "data.train_files=/data/kk/train.parquet", "data.seed=1", "trainer.total_training_steps=5",
                 "trainer.experiment_name=a0.25-s1", "trainer.n_gpus_per_node=8",
                 f"trainer.default_local_dir={(tmp_path / 'runs' / 'gpu' / 'a0.25-s1' / 'checkpoints').resolve()}",
                 # the run store the trainer writes (dataflex_rl/verl/run_record.py)
                 f"+dataflex_run.dir={(tmp_path / 'runs' / 'gpu' / 'a0.25-s1').resolve()}", "+dataflex_run.sweep=gpu",
                 "+dataflex_run.name=a0.25-s1", "+dataflex_run.seed=1"):
        assert part in line, part
    assert "OMP_NUM_THREADS" not in line and "threads=" not in line


def test_verl_backend_refuses_a_staged_mechanism_with_a_moving_lr_before_anything_starts(tmp_path, capsys):
    code = main(["backend=verl", "mechanisms=lopti", "seeds=1", "dry_run=true", f"root={tmp_path / 'runs'}",
                 "name=lr", "extra=[model=/models/qwen data_dir=/data/kk actor_rollout_ref.actor.optim.warmup_style=cosine]"])
    captured = capsys.readouterr()
    assert code == 2
    assert "actor_rollout_ref.actor.optim.warmup_style = 'cosine' is not allowed" in captured.err
    assert "verl.trainer.main_ppo" not in captured.out  # a dry run that prints nothing it would refuse
    assert not (tmp_path / "runs").exists()


def test_verl_cpu_experiment_plans_its_prepare_step_and_cpu_environment_without_a_gpu(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["backend=verl", "verl_experiment=verl_cpu_tiny", "alpha=0.5", "seeds=1", "steps=2",
                 "dry_run=true", f"root={tmp_path / 'runs'}", "name=cpu"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    prepared = (tmp_path / "runs" / "cpu" / "verl_prepared" / "sft-seed1").resolve()  # seed 1's warm start
    [prepare] = [line for line in lines if "dataflex_rl.verl.cpu.prepare" in line]
    assert f"--out {prepared}" in prepare and "model.architecture=llama" in prepare
    runs = [line for line in lines if "verl.trainer.main_ppo" in line]
    assert len(runs) == 2
    for line in runs:
        assert "VERL_PLATFORM=cpu" in line and "VERL_USE_EXTERNAL_MODULES=dataflex_rl.verl.cpu.plugin" in line
        assert f"actor_rollout_ref.model.path={prepared}/model" in line


def test_verl_backend_without_a_gpu_is_refused_with_a_clear_message(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["backend=verl", "alpha=0.25", "seeds=1", f"root={tmp_path / 'runs'}", "name=gpu",
                 "extra=[model=/models/qwen data_dir=/data/kk]"])
    assert code == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["backend=verl", "seeds=1", "dry_run=true", f"root={tmp_path / 'runs'}"]) == 2
    assert "model" in capsys.readouterr().err  # the experiment's model path is missing


# --- Ray ---------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes_mentioning(marker: str) -> list[int]:
    """Pids whose command line holds ``marker`` (the head's own temp dir or port), so only this head is stopped."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie left for init to reap counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def with_descendants(roots: set[int]) -> set[int]:
    """``roots`` and every process below them (Ray's agents rename themselves, ``ray::RuntimeEnvAgent``)."""
    parents = {int(entry.name): parent_of(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    found = set(roots)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found and pid not in found}
        if not more:
            return found
        found |= more


def stop_ray_head(temp_dir: str, gcs_port: int) -> None:
    """``ray stop`` scoped to this head: ``ray stop`` itself kills every Ray process of the user, other clusters
    included, so the head's processes are found by their temp dir and port (and their children) and stopped by
    pid: SIGTERM, then SIGKILL after 3 s."""
    markers = (temp_dir, f":{gcs_port}")
    pids = with_descendants({pid for marker in markers for pid in processes_mentioning(marker)})
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def ray_head():
    """A Ray head on loopback with its own temp dir, one CPU and the dashboard (the Jobs API) on a free port."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray is None:
        pytest.skip("the ray CLI is not installed")
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's unix socket paths are length-limited
    gcs_port, dashboard_port = free_port(), free_port()
    # Token authentication off on both sides: a ~/.ray/auth_token left by any earlier local Ray would switch it on
    # for this head (RAY_AUTH_MODE unset + a token file) while the sweep's client sends none.
    env = {**os.environ, "RAY_TMPDIR": temp_dir, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [ray, "start", "--head", f"--port={gcs_port}", f"--dashboard-port={dashboard_port}",
               "--include-dashboard=true", "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1",
               f"--temp-dir={temp_dir}", "--num-cpus=1", f"--ray-client-server-port={free_port()}",
               f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]
    try:
        started = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"http://127.0.0.1:{dashboard_port}"
    finally:
        stop_ray_head(temp_dir, gcs_port)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_launcher_submits_one_ray_job_per_run(tmp_path, ray_head, monkeypatch):
    from ray.job_submission import JobStatus, JobSubmissionClient

    monkeypatch.setenv("RAY_ADDRESS", ray_head)  # the address comes from the environment here
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert main(standin_argv(tmp_path, "launcher=ray")) == 0
    sweep_dir = tmp_path / "runs" / "scale"
    runs = runs_by_name(sweep_dir)
    client = JobSubmissionClient(ray_head)
    for name, entry in runs.items():
        assert (entry["state"], entry["exit_code"]) == ("completed", 0)
        assert client.get_job_status(entry["launch"]["job_id"]) == JobStatus.SUCCEEDED
        assert f"scripted run {name} completed at step 2" in (sweep_dir / "logs" / f"{name}.log").read_text()
    assert read_manifest(sweep_dir)["launcher"] == "ray"


def test_a_ray_cluster_with_token_authentication_is_refused_with_the_fix(tmp_path, monkeypatch, capsys):
    import ray.job_submission

    class TokenCluster:
        def __init__(self, address):
            raise RuntimeError("Authentication required: Unauthorized: Missing authentication token")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", TokenCluster)
    assert main(standin_argv(tmp_path, "launcher=ray", "ray.address=http://127.0.0.1:8265")) == 2
    error = capsys.readouterr().err
    assert "ray.address = 'http://127.0.0.1:8265' is not allowed" in error
    assert "RAY_AUTH_MODE=token" in error and "RAY_AUTH_TOKEN" in error
    assert not (tmp_path / "runs" / "scale").exists()  # refused before anything was written


@pytest.mark.parametrize(("settings", "key"), [
    ({"partition": "gpu\n#SBATCH --wrap=rm"}, "slurm.partition"),
    ({"partition": "gpu;x"}, "slurm.partition"),
    ({"additional_parameters": {"constraint": "a100\n#SBATCH --x"}}, "slurm.additional_parameters.constraint"),
    ({"additional_parameters": {"bad key": "x"}}, "slurm.additional_parameters"),
    ({"setup": ["module load x\nrm -rf y"]}, "slurm.setup[0]"),
])
def test_slurm_strings_that_would_split_the_job_script_are_refused(settings, key):
    from sweeps.launchers.slurm import SlurmSettings

    with pytest.raises(ConfigError, match=rf"^{re.escape(key)} = .* is not allowed"):
        SlurmSettings(**settings)
    assert SlurmSettings(partition="gpu,cpu_long-2", setup=["module load cuda"]).partition == "gpu,cpu_long-2"


def test_a_ray_address_with_spaces_or_newlines_is_refused():
    from sweeps.launchers.ray import RaySettings

    for address in ("http://x:8265\nEVIL", "http://x:8265 ; rm"):
        with pytest.raises(ConfigError, match=r"ray.address = .* is not allowed"):
            RaySettings(address=address)
    for address in ("http://127.0.0.1:8265", "https://ray.example.org/dash", "ray://head:10001", "head:8265"):
        assert RaySettings(address=address).address == address
