"""Scale-out launchers (SLURM through submitit's local executor; Ray: test_sweep_ray_cluster.py) and the verl
backend's command lines; the scripted stand-in trainer does the runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dataflex_rl.validation import ConfigError
from sweeps.cli import main

from .conftest import SCRIPTED_TRAIN, runs_by_name


def standin_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["alpha=0.5", "seeds=1", "steps=2", f"root={tmp_path / 'runs'}", "name=scale",
            f"train_module={SCRIPTED_TRAIN}", "local.sft_warm_start=false", "report=false", "poll_s=0.1", *more]


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
    code = main(["backend=verl", "verl.experiment=verl_cpu_tiny", "alpha=0.5", "seeds=1", "steps=2",
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
