"""``launcher=slurm``: one SLURM job per run through submitit, submitted as one job array whose
``array_parallelism`` is ``jobs``.

Settings: the ``slurm:`` block of ``conf/sweeps/launcher/slurm.yaml`` (:class:`SlurmSettings`).
``slurm.cluster=submitit_local`` runs the same jobs through submitit's local executor, for trying a sweep without
SLURM; ``debug`` runs them in the driver's process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.validation import ConfigError, check_choice, check_int_at_least, check_number
from sweeps.launchers.base import (
    LAUNCHERS,
    Job,
    Launcher,
    Outcome,
    RunToLaunch,
    check_launcher_string,
    process_matches,
)

# slurm.cluster -> submitit's cluster name ("submitit_local": "local" alone is the CPU backend's name).
SUBMITIT_CLUSTERS = {"slurm": "slurm", "submitit_local": "local", "debug": "debug"}
PARTITION_PATTERN = r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*"  # sbatch --partition: names, comma-separated
OPTION_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*"  # an sbatch long option's name (submitit writes #SBATCH --<name>=...)


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """Resources of each SLURM job (``slurm.*``); one job per run, submitted as one job array through submitit."""

    cluster: str = "slurm"  # slurm | submitit_local (submitit's local executor, for testing) | debug (in-process)
    partition: str | None = None
    timeout_min: int = 1440
    cpus_per_task: int = 8
    gpus_per_node: int = 0
    mem_gb: float | None = None
    additional_parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    setup: tuple[str, ...] = ()  # shell lines run before each job (module load ..., source venv)

    def __post_init__(self) -> None:
        check_choice("slurm.cluster", self.cluster, tuple(SUBMITIT_CLUSTERS))
        check_int_at_least("slurm.timeout_min", self.timeout_min, 1)
        check_int_at_least("slurm.cpus_per_task", self.cpus_per_task, 1)
        check_int_at_least("slurm.gpus_per_node", self.gpus_per_node, 0)
        if self.mem_gb is not None:
            check_number("slurm.mem_gb", self.mem_gb, minimum=0.0, exclusive=True)
        if not isinstance(self.additional_parameters, Mapping):
            raise ConfigError(f"slurm.additional_parameters = {self.additional_parameters!r} is not allowed: it must "
                              f"be a mapping of sbatch options, e.g. {{constraint: a100}}")
        if self.partition is not None:
            check_launcher_string("slurm.partition", self.partition, PARTITION_PATTERN,
                                  "a SLURM partition name (letters, digits, '_', '.', '-'; several joined by ',')")
        for name, value in self.additional_parameters.items():
            check_launcher_string("slurm.additional_parameters", str(name), OPTION_PATTERN,
                                  "an sbatch option name (letters, digits, '_', '-'), e.g. constraint")
            check_launcher_string(f"slurm.additional_parameters.{name}", str(value))
        setup = self.setup
        object.__setattr__(self, "setup", tuple(str(line) for line in (
            [] if setup is None else [setup] if isinstance(setup, str) else setup)))
        for index, line in enumerate(self.setup):  # each a line of the job script: a list item per line
            check_launcher_string(f"slurm.setup[{index}]", line)


def run_command(command: Sequence[str], env: Mapping[str, str], cwd: str, log_path: str) -> int:
    """Run one command with its output appended to ``log_path``; return its exit code (the job's result).

    SIGTERM/SIGINT sent to the job (scancel, submitit's cancel) are passed on to the run as SIGTERM, so it can mark
    itself interrupted before SLURM's SIGKILL.
    """
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(list(command), cwd=cwd, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)

        def forward(signum: int, frame: Any) -> None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

        previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            return process.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _executor_parameters(settings: SlurmSettings, sweep: str, parallelism: int) -> dict[str, Any]:
    """submitit's ``update_parameters`` arguments for the job array."""
    parameters: dict[str, Any] = {
        "name": f"sweep-{sweep}", "timeout_min": settings.timeout_min, "cpus_per_task": settings.cpus_per_task,
        "gpus_per_node": settings.gpus_per_node, "slurm_array_parallelism": parallelism,
    }
    if settings.mem_gb is not None:
        parameters["mem_gb"] = settings.mem_gb
    if settings.partition:
        parameters["slurm_partition"] = settings.partition
    if settings.additional_parameters:
        parameters["slurm_additional_parameters"] = dict(settings.additional_parameters)
    if settings.setup:
        parameters["slurm_setup"] = list(settings.setup)
    return parameters


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    """One SLURM job per run through submitit, submitted as a job array (see the module doc)."""

    name = "slurm"
    settings = SlurmSettings
    batch = True
    threads_origin = "slurm.cpus_per_task"

    @classmethod
    def from_config(cls, settings: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        """A submitit executor for the sweep folder, ``parallelism`` jobs of the array at once."""
        return cls(settings or SlurmSettings(), sweep_dir, sweep, parallelism)

    @classmethod
    def threads_per_run(cls, settings: Any) -> int | None:
        """Each job owns its ``slurm.cpus_per_task`` CPUs: that many threads."""
        return (settings or SlurmSettings()).cpus_per_task

    def __init__(self, settings: SlurmSettings, sweep_dir: Path, sweep: str, parallelism: int) -> None:
        import submitit

        if settings.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError("launcher = 'slurm' is not allowed here: no sbatch on PATH. Run on a SLURM login "
                              "node, or give slurm.cluster=submitit_local to run the jobs through submitit's local "
                              "executor")
        self.folder = sweep_dir / "submitit" / "%j"
        self.executor = submitit.AutoExecutor(folder=self.folder, cluster=SUBMITIT_CLUSTERS[settings.cluster])
        self.executor.update_parameters(**_executor_parameters(settings, sweep, parallelism))
        self.cluster = settings.cluster
        self.cwd = os.getcwd()

    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        """Submit ``runs`` as one job array."""
        with self.executor.batch():
            handles = [self.executor.submit(run_command, list(run.command), dict(run.env), self.cwd,
                                            str(run.log_path)) for run in runs]
        return [Job(run=run, handle=handle, info={"job_id": str(handle.job_id)})
                for run, handle in zip(runs, handles, strict=True)]

    def poll(self, job: Job) -> Outcome | None:
        """The job's result (the run's exit code) once done; a job that failed itself gives an error."""
        if not job.handle.done():
            return None
        try:
            return Outcome(int(job.handle.result()))
        except Exception as error:  # noqa: BLE001  (the job itself failed: node failure, timeout, cancel)
            return Outcome(None, f"SLURM job {job.handle.job_id} failed: {str(error).strip().splitlines()[0]}")

    def terminate(self, job: Job) -> None:
        """Cancel the job (scancel: SIGTERM to the run, then SLURM's SIGKILL)."""
        with contextlib.suppress(Exception):
            job.handle.cancel(check=False)

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        """A job of a killed driver (a login-node session that ended) may still be queued or running."""
        import submitit

        job_id = str(info.get("job_id") or "")
        if not job_id:
            return False
        if self.cluster == "submitit_local":  # submitit's local job id is its controller's pid
            return job_id.isdigit() and process_matches(int(job_id), "submitit")
        if self.cluster != "slurm":
            return False
        try:
            return not submitit.SlurmJob(folder=self.folder, job_id=job_id).done(force_check=True)
        except Exception:  # noqa: BLE001  (sacct unavailable or the job forgotten: nothing to wait for)
            return False
