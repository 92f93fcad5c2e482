"""``launcher=slurm``: one SLURM job per run through submitit, one job array whose parallelism is ``jobs``.
``slurm.cluster=submitit_local`` runs the same jobs through submitit's local executor (no SLURM needed), ``debug``
in the driver's process."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.validation import ConfigError, check_choice, check_int_at_least, check_number
from sweeps.launchers.base import (LAUNCHERS, Job, Launcher, Outcome, RunToLaunch, check_launcher_string,
                                   process_matches)

# slurm.cluster -> submitit's cluster name ("submitit_local": "local" alone is the CPU backend's name).
SUBMITIT_CLUSTERS = {"slurm": "slurm", "submitit_local": "local", "debug": "debug"}
PARTITION_PATTERN = r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*"  # sbatch --partition: names, comma-separated
OPTION_PATTERN = r"[A-Za-z][A-Za-z0-9_-]*"  # an sbatch long option's name (submitit writes #SBATCH --<name>=...)
GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")  # the count of each gpu entry of sinfo's gres


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    cluster: str = "slurm"  # slurm | submitit_local (submitit's local executor, for testing) | debug (in-process)
    partition: str | None = None
    timeout_min: int = 1440
    cpus_per_task: int = 8  # also each run's thread count, unless threads=N
    gpus_per_node: int = 0
    # per job (a local run peaks at 0.7 GB, verl's CPU mode at 6.8 GB); None: SLURM's default, often the whole node
    mem_gb: float | None = 4.0
    additional_parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # {constraint: a100}
    setup: tuple[str, ...] = ()  # shell lines run before each job, e.g. ["source .venv/bin/activate"]

    def __post_init__(self) -> None:
        check_choice("slurm.cluster", self.cluster, tuple(SUBMITIT_CLUSTERS))
        check_int_at_least("slurm.timeout_min", self.timeout_min, 1)
        check_int_at_least("slurm.cpus_per_task", self.cpus_per_task, 1)
        check_int_at_least("slurm.gpus_per_node", self.gpus_per_node, 0)
        if self.mem_gb is not None and check_number("slurm.mem_gb", self.mem_gb) * 1024 < 1:
            raise ConfigError(f"slurm.mem_gb = {self.mem_gb!r} is not allowed: it must be at least 1 MB (1/1024 GB): "
                              f"a smaller request reaches sbatch as --mem=0MB, which SLURM reads as a whole node")
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
        object.__setattr__(self, "setup", tuple(str(line) for line in (
            [] if self.setup is None else [self.setup] if isinstance(self.setup, str) else self.setup)))
        for index, line in enumerate(self.setup):  # each a line of the job script: a list item per line
            check_launcher_string(f"slurm.setup[{index}]", line)


def run_command(command: Sequence[str], env: Mapping[str, str], cwd: str, log_path: str) -> dict[str, Any]:
    """The job: run ``command``, forwarding SIGTERM/SIGINT/USR2 (time limit) to it as SIGTERM."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    stopped_by: list[str] = []
    with open(log_path, "ab") as log:
        process = subprocess.Popen(list(command), cwd=cwd, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT)

        def forward(signum: int, frame: Any) -> None:
            stopped_by.append(signal.Signals(signum).name)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)}
        try:
            code = process.wait()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
    return {"exit_code": code, "stopped_by": stopped_by[0] if stopped_by else None}


def signal_margin_s(timeout_min: int) -> int:
    """A tenth of the limit, 20-90 s (SLURM may send USR2 a minute early)."""
    return int(min(90, max(20, timeout_min * 6)))


# squeue's states of a job that has not ended (a requeued job is PENDING again); the others are final.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                           "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# Final states in which the scheduler, not the run, ended the job: the run is interrupted and resumes.
STOPPED_STATES = {"CANCELLED": "was cancelled (scancel)", "TIMEOUT": "reached its time limit",
                  "PREEMPTED": "was preempted", "NODE_FAIL": "lost its node (NODE_FAIL)",
                  "DEADLINE": "passed its deadline", "BOOT_FAIL": "could not boot its node"}


class SlurmQueue:
    """squeue's ``(state, reason)`` of the user's jobs, read at most every ``every_s`` seconds."""

    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.jobs: dict[str, tuple[str, str]] = {}
        self.problem: str | None = None
        self.read_at = -float("inf")

    def get(self, job_id: str) -> tuple[str, str] | None:
        if time.monotonic() - self.read_at >= self.every_s:
            self.refresh()
        return self.jobs.get(job_id)

    def refresh(self) -> None:
        self.read_at = time.monotonic()
        try:
            done = subprocess.run(["squeue", "--me", "-h", "-r", "--states=all", "-o", "%i|%T|%r"],
                                  capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            self.problem = str(error)
            return
        if done.returncode != 0:
            self.problem = done.stderr.strip() or f"squeue exited with code {done.returncode}"
            return
        self.problem = None
        self.jobs = {}
        for line in done.stdout.splitlines():
            job_id, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            self.jobs[job_id.strip()] = (state.strip().split()[0] if state.strip() else "", reason.strip())


def check_request(settings: SlurmSettings) -> None:
    """Refuse jobs no node of their partition could ever run, before any is submitted: sbatch refuses an unknown
    partition, GPUs or memory beyond a node's; more CPUs than a node has wait forever (PENDING: PartitionConfig).
    Unchecked where sinfo cannot tell."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%P %c %m %G"], capture_output=True, text=True, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    rows = [row for row in (line.split() for line in done.stdout.splitlines()) if len(row) == 4] \
        if done.returncode == 0 else []
    # one row per node and partition ("*": the default one); GPUs from its gres, e.g. gpu:a100:4(S:0-1)
    nodes = [(name.rstrip("*"), name.endswith("*"), (int(cpus), sum(map(int, GPU_GRES.findall(gres))), int(memory)))
             for name, cpus, memory, gres in rows if cpus.isdigit() and memory.isdigit()]
    partitions = sorted({name for name, *_ in nodes})
    wanted = settings.partition.split(",") if settings.partition else [name for name, default, _ in nodes if default]
    if nodes and not set(wanted) <= set(partitions):
        raise ConfigError(f"slurm.partition = {settings.partition!r} is not allowed: this cluster's partitions: "
                          f"{', '.join(partitions)}")
    sizes = [size for name, _, size in nodes if name in wanted]
    where = f"partition {','.join(sorted(set(wanted)))}"
    for index, (key, value, what) in enumerate((("slurm.cpus_per_task", settings.cpus_per_task, "CPUs"),
                                                ("slurm.gpus_per_node", settings.gpus_per_node, "GPUs"))):
        if sizes and value > max(size[index] for size in sizes):
            raise ConfigError(f"{key} = {value} is not allowed: no node of {where} has that many {what}; allowed: "
                              f"at most {max(size[index] for size in sizes)}")
    fits = [memory for cpus, gpus, memory in sizes if cpus >= settings.cpus_per_task and gpus >= settings.gpus_per_node]
    if fits and settings.mem_gb is not None and int(settings.mem_gb * 1024) > max(fits):  # submitit's GB: 1024 MB
        raise ConfigError(f"slurm.mem_gb = {settings.mem_gb:g} is not allowed: no node of {where} has that much "
                          f"memory, so SLURM would refuse every job; allowed: at most "
                          f"{int(max(fits) / 1024 * 100) / 100:g} (a node's {max(fits)} MB), or null for SLURM's "
                          f"default")


def _executor_parameters(settings: SlurmSettings, sweep: str, parallelism: int) -> dict[str, Any]:
    optional = {"mem_gb": settings.mem_gb, "slurm_partition": settings.partition or None,
                "slurm_additional_parameters": dict(settings.additional_parameters) or None,
                "slurm_setup": list(settings.setup) or None}
    return {"name": f"sweep-{sweep}", "timeout_min": settings.timeout_min, "cpus_per_task": settings.cpus_per_task,
            "gpus_per_node": settings.gpus_per_node, "slurm_array_parallelism": parallelism,
            "slurm_signal_delay_s": signal_margin_s(settings.timeout_min),
            **{key: value for key, value in optional.items() if value is not None}}


@LAUNCHERS.register("slurm")
class SlurmLauncher(Launcher):
    settings = SlurmSettings
    batch = True
    threads_origin = "slurm.cpus_per_task"

    @classmethod
    def from_config(cls, settings: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        return cls(settings or SlurmSettings(), sweep_dir, sweep, parallelism)

    @classmethod
    def threads_per_run(cls, settings: Any) -> int | None:
        return (settings or SlurmSettings()).cpus_per_task

    def __init__(self, settings: SlurmSettings, sweep_dir: Path, sweep: str, parallelism: int) -> None:
        import submitit

        if settings.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError("launcher = 'slurm' is not allowed here: no sbatch on PATH. Run on a SLURM login "
                              "node, or give slurm.cluster=submitit_local to run the jobs through submitit's local "
                              "executor")
        if settings.cluster == "slurm":
            check_request(settings)
        self.folder = sweep_dir / "submitit" / "%j"
        self.executor = submitit.AutoExecutor(folder=self.folder, cluster=SUBMITIT_CLUSTERS[settings.cluster])
        self.executor.update_parameters(**_executor_parameters(settings, sweep, parallelism))
        self.cluster, self.timeout_min = settings.cluster, settings.timeout_min
        self.queue = SlurmQueue() if settings.cluster == "slurm" else None
        self.cwd = os.getcwd()

    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        try:
            with self.executor.batch():
                handles = [self.executor.submit(run_command, list(run.command), dict(run.env), self.cwd,
                                                str(run.log_path)) for run in runs]
        except Exception as error:  # sbatch refused: the reason goes where the driver sends the reader, the log
            for run in runs:
                with open(run.log_path, "a", encoding="utf-8") as log:
                    log.write(f"the job was not submitted: {error}\n")
            raise
        return [Job(run=run, handle=handle, info={"job_id": str(handle.job_id)})
                for run, handle in zip(runs, handles, strict=True)]

    def poll(self, job: Job) -> Outcome | None:
        """A requeued job is waiting again, not ended."""
        if self.queue is None:  # submitit's local executor or debug: submitit knows when the job is done
            return self._outcome(job, None) if job.handle.done() else None
        state = self.queue.get(str(job.handle.job_id))
        if state is None and not job.handle.paths.result_pickle.exists():
            if self.queue.problem is not None or self.queue.read_at < job.started:
                return None  # squeue failed, or was read before the job was submitted: not known to have ended
            return Outcome(None, f"SLURM job {job.handle.job_id} is no longer in SLURM's queue and wrote no result; "
                                 f"see {job.handle.paths.stderr}")
        if state is not None and state[0] in ACTIVE_STATES:
            return None
        return self._outcome(job, state[0] if state else None)

    def _outcome(self, job: Job, final_state: str | None) -> Outcome:
        job_id = job.handle.job_id
        result, error = None, None
        if job.handle.paths.result_pickle.exists() or self.queue is None:
            try:
                result = job.handle.result()
            except Exception as failure:  # noqa: BLE001  (the job itself failed: node failure, timeout, cancel)
                error = f"SLURM job {job_id} failed: {str(failure).strip().splitlines()[0]}"
        code = result["exit_code"] if isinstance(result, dict) else None
        if final_state in STOPPED_STATES or (result or {}).get("stopped_by") == "SIGUSR2":
            what = STOPPED_STATES.get(final_state or "TIMEOUT", STOPPED_STATES["TIMEOUT"])
            if what == STOPPED_STATES["TIMEOUT"]:
                what += f" (slurm.timeout_min={self.timeout_min})"
            return Outcome(code, f"SLURM job {job_id} {what}; the run keeps its last checkpoint and resumes "
                                 f"when the sweep is run again", interrupted=True)
        if final_state not in (None, "COMPLETED") and error is None:
            error = f"SLURM job {job_id} ended {final_state}"
        return Outcome(code, error)

    def waiting(self, job: Job) -> str | None:
        if self.queue is None:
            return None
        state = self.queue.get(str(job.handle.job_id))
        if self.queue.problem is not None:
            return f"squeue failed ({self.queue.problem.splitlines()[0]}); the job's state is unknown"
        if state is None or state[0] not in ACTIVE_STATES or state[0] in ("RUNNING", "COMPLETING"):
            return None
        return f"{state[0]}: {state[1]}" if state[1] and state[1] != "None" else state[0]

    def terminate(self, job: Job) -> None:
        with contextlib.suppress(Exception):
            job.handle.cancel(check=False)

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        job_id = str(info.get("job_id") or "")
        if not job_id:
            return False
        if self.cluster == "submitit_local":  # submitit's local job id is its controller's pid
            return job_id.isdigit() and process_matches(int(job_id), "submitit")
        if self.queue is None:
            return False
        self.queue.refresh()
        state = self.queue.get(job_id)
        return state is not None and state[0] in ACTIVE_STATES
