"""Launchers: each run in its own OS process, so a crash or SIGKILL of one run never stops the others.

- :class:`LocalLauncher`: ``subprocess.Popen`` per run in its own session (a terminal's Ctrl-C reaches only the
  driver, which then stops the runs itself); on Linux each child gets SIGTERM if the driver dies
  (``PR_SET_PDEATHSIG``), so no run outlives a hard-killed driver.
- :class:`SlurmLauncher`: one SLURM job per run through submitit, submitted as one job array whose
  ``array_parallelism`` is ``jobs``; ``slurm.cluster=local`` runs the same jobs through submitit's local executor.
- :class:`RayLauncher`: one Ray Job per run through ``ray.job_submission.JobSubmissionClient``; inside a Ray Job,
  ``ray.init()`` (verl's own) joins the same cluster.

The driver polls :meth:`Launcher.poll` and stops runs with :meth:`Launcher.terminate` (SIGTERM, scancel, stop_job)
then :meth:`Launcher.kill` after the grace period. Exit codes follow ``subprocess``: negative = killed by that signal.
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.registry import Registry
from dataflex_rl.validation import ConfigError
from sweeps.commands import PlannedRun
from sweeps.config import SweepConfig

_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a run's process ended: its exit code (None when unknown) and, if any, what went wrong around it."""

    exit_code: int | None
    error: str | None = None


@dataclasses.dataclass
class Job:
    """A launched run: the plan and the launcher's handle (process, submitit job or Ray job id)."""

    run: PlannedRun
    handle: Any
    info: dict[str, Any]
    started: float = dataclasses.field(default_factory=time.monotonic)


def write_log_header(log_path: Path, attempt: int, line: str) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== attempt {attempt} at {time.strftime('%Y-%m-%d %H:%M:%S')}: {line}\n")


LAUNCHERS = Registry("launcher")


class Launcher(abc.ABC):
    """Starts runs, reports their end, stops them. Subclasses registered in :data:`LAUNCHERS` under their
    ``launcher=`` name are built by :meth:`from_config`."""

    name: str = ""
    batch: bool = False  # True: every pending run is submitted at once and the scheduler limits concurrency

    @classmethod
    def from_config(cls, config: SweepConfig, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        """The launcher for one sweep (``parallelism``: the most runs live at once)."""
        return cls()

    @abc.abstractmethod
    def launch(self, runs: Sequence[PlannedRun]) -> list[Job]:
        """Start ``runs``; one :class:`Job` per run, in order."""

    @abc.abstractmethod
    def poll(self, job: Job) -> Outcome | None:
        """The outcome once the run has ended, else None."""

    @abc.abstractmethod
    def terminate(self, job: Job) -> None:
        """Ask the run to stop (it marks itself interrupted and keeps its checkpoint)."""

    def kill(self, job: Job) -> None:
        """Stop the run now (after the grace period)."""
        self.terminate(job)

    def still_running(self, info: Mapping[str, Any], run: PlannedRun) -> bool:
        """Whether a run launched by an earlier invocation (``info`` from sweep.json) is still going."""
        return False

    def close(self) -> None:
        """Release connections."""


# --- local ---------------------------------------------------------------------------------------------------------
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


_LIBC = _libc() if os.name == "posix" and os.uname().sysname == "Linux" else None


def _die_with_parent() -> None:
    """Child-side setup: receive SIGTERM when the driver dies, so a hard-killed driver leaves no orphan run."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _process_matches(pid: int, marker: str) -> bool:
    """True when process ``pid`` is alive and its command line holds ``marker`` (a run folder)."""
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in command_line


@LAUNCHERS.register("local")
class LocalLauncher(Launcher):
    """Each run a child process of the driver, in its own session (see the module doc)."""

    name = "local"

    def launch(self, runs: Sequence[PlannedRun]) -> list[Job]:
        jobs = []
        for run in runs:
            run.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(run.log_path, "ab") as log:
                process = subprocess.Popen(
                    list(run.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **run.env}, start_new_session=True,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509  (the local launcher's driver starts no threads)
                )
            jobs.append(Job(run=run, handle=process, info={"pid": process.pid}))
        return jobs

    def poll(self, job: Job) -> Outcome | None:
        code = job.handle.poll()
        return None if code is None else Outcome(code)

    def _signal(self, job: Job, signum: int) -> None:
        # The child leads its own process group (start_new_session): signal the group, helpers included.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.handle.pid, signum)

    def terminate(self, job: Job) -> None:
        self._signal(job, signal.SIGTERM)

    def kill(self, job: Job) -> None:
        self._signal(job, signal.SIGKILL)

    def still_running(self, info: Mapping[str, Any], run: PlannedRun) -> bool:
        pid = info.get("pid")
        return isinstance(pid, int) and _process_matches(pid, str(run.run_dir))


# --- SLURM through submitit ----------------------------------------------------------------------------------------
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


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    """One SLURM job per run through submitit, submitted as a job array (see the module doc)."""

    name = "slurm"
    batch = True

    @classmethod
    def from_config(cls, config: SweepConfig, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        """A submitit executor for the sweep folder, ``parallelism`` jobs of the array at once."""
        return cls(config, sweep_dir, sweep, parallelism)

    def __init__(self, config: SweepConfig, sweep_dir: Path, sweep: str, parallelism: int) -> None:
        import submitit

        settings = config.slurm
        if settings.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError("launcher = 'slurm' is not allowed here: no sbatch on PATH. Run on a SLURM login "
                              "node, or give slurm.cluster=local to run the jobs through submitit's local executor")
        self.executor = submitit.AutoExecutor(folder=sweep_dir / "submitit" / "%j", cluster=settings.cluster)
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
        self.executor.update_parameters(**parameters)
        self.cluster = settings.cluster
        self.folder = sweep_dir / "submitit" / "%j"
        self.cwd = os.getcwd()

    def launch(self, runs: Sequence[PlannedRun]) -> list[Job]:
        with self.executor.batch():
            handles = [self.executor.submit(run_command, list(run.command), dict(run.env), self.cwd,
                                            str(run.log_path)) for run in runs]
        return [Job(run=run, handle=handle, info={"job_id": str(handle.job_id)})
                for run, handle in zip(runs, handles, strict=True)]

    def poll(self, job: Job) -> Outcome | None:
        if not job.handle.done():
            return None
        try:
            return Outcome(int(job.handle.result()))
        except Exception as error:  # noqa: BLE001  (the job itself failed: node failure, timeout, cancel)
            return Outcome(None, f"SLURM job {job.handle.job_id} failed: {str(error).strip().splitlines()[0]}")

    def terminate(self, job: Job) -> None:
        with contextlib.suppress(Exception):
            job.handle.cancel(check=False)

    def still_running(self, info: Mapping[str, Any], run: PlannedRun) -> bool:
        """A job of a killed driver (a login-node session that ended) may still be queued or running."""
        import submitit

        job_id = str(info.get("job_id") or "")
        if not job_id:
            return False
        if self.cluster == "local":  # submitit's local job id is its controller's pid
            return job_id.isdigit() and _process_matches(int(job_id), "submitit")
        if self.cluster != "slurm":
            return False
        try:
            return not submitit.SlurmJob(folder=self.folder, job_id=job_id).done(force_check=True)
        except Exception:  # noqa: BLE001  (sacct unavailable or the job forgotten: nothing to wait for)
            return False


# --- Ray Jobs --------------------------------------------------------------------------------------------------------
@LAUNCHERS.register("ray")
class RayLauncher(Launcher):
    """One Ray job per run on the cluster at ``ray.address`` (see the module doc)."""

    name = "ray"
    poll_every_s = 1.0  # each poll is an HTTP request to the dashboard

    @classmethod
    def from_config(cls, config: SweepConfig, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        """A job client for the configured Ray address."""
        return cls(config, sweep)

    def __init__(self, config: SweepConfig, sweep: str) -> None:
        from ray.job_submission import JobSubmissionClient

        self.address = config.ray.resolved_address()
        try:
            self.client = JobSubmissionClient(self.address)
        except Exception as error:  # noqa: BLE001  (any connection problem refuses the sweep with its reason)
            reason = str(error).strip().splitlines()[0]
            hint = ("; the cluster uses Ray's token authentication: run the sweep with RAY_AUTH_MODE=token and the "
                    "cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token") if "authentication" in reason.lower() else ""
            raise ConfigError(f"ray.address = {self.address!r} is not allowed: no Ray dashboard answers there "
                              f"({reason}){hint}") from None
        self.settings = config.ray
        self.sweep = sweep
        self.cwd = os.getcwd()
        self._last_poll: dict[str, float] = {}

    def launch(self, runs: Sequence[PlannedRun]) -> list[Job]:
        jobs = []
        for run in runs:
            submission_id = f"{self.sweep}-{run.name}-{uuid.uuid4().hex[:8]}"
            entrypoint = f"cd {shlex.quote(self.cwd)} && exec {shlex.join(run.command)}"
            options: dict[str, Any] = {}
            if self.settings.entrypoint_num_cpus is not None:
                options["entrypoint_num_cpus"] = self.settings.entrypoint_num_cpus
            if self.settings.entrypoint_num_gpus is not None:
                options["entrypoint_num_gpus"] = self.settings.entrypoint_num_gpus
            job_id = self.client.submit_job(
                entrypoint=entrypoint, submission_id=submission_id, runtime_env={"env_vars": dict(run.env)},
                metadata={"sweep": self.sweep, "run": run.name}, **options,
            )
            jobs.append(Job(run=run, handle=job_id, info={"job_id": job_id, "address": self.address}))
        return jobs

    def poll(self, job: Job) -> Outcome | None:
        from ray.job_submission import JobStatus

        now = time.monotonic()
        if now - self._last_poll.get(job.handle, 0.0) < self.poll_every_s:
            return None
        self._last_poll[job.handle] = now
        info = self.client.get_job_info(job.handle)
        if info.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return None
        self._append_logs(job)
        code = info.driver_exit_code
        if code is None:
            code = {JobStatus.SUCCEEDED: 0, JobStatus.STOPPED: 130}.get(info.status, 1)
        error = None if info.status == JobStatus.SUCCEEDED else f"Ray job {job.handle} {info.status.value}: " \
                                                                 f"{(info.message or '').strip()}"
        return Outcome(code, error)

    def _append_logs(self, job: Job) -> None:
        try:
            logs = self.client.get_job_logs(job.handle)
        except Exception as error:  # noqa: BLE001  (missing logs must not lose the run's outcome)
            logs = f"(could not fetch the Ray job's logs: {error})\n"
        job.run.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(job.run.log_path, "a", encoding="utf-8") as log:
            log.write(logs)

    def terminate(self, job: Job) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_job(job.handle)

    def still_running(self, info: Mapping[str, Any], run: PlannedRun) -> bool:
        from ray.job_submission import JobStatus

        job_id = info.get("job_id")
        if not job_id or info.get("address") != self.address:
            return False
        try:
            return self.client.get_job_status(job_id) in (JobStatus.PENDING, JobStatus.RUNNING)
        except Exception:  # noqa: BLE001  (an unknown job is not running)
            return False


def build_launcher(config: SweepConfig, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
    """The launcher registered under ``config.launcher``."""
    return LAUNCHERS.get(config.launcher).from_config(config, sweep_dir, sweep, parallelism)