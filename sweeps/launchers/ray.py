"""``launcher=ray``: one Ray Job per run through ``ray.job_submission.JobSubmissionClient``; inside a Ray Job,
``ray.init()`` (verl's own) joins the same cluster."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.validation import ConfigError, check_number
from sweeps.launchers.base import LAUNCHERS, Job, Launcher, Outcome, RunToLaunch, check_launcher_string

# What JobSubmissionClient takes: the dashboard's http(s) URL, a ray:// client address, or HOST:PORT.
ADDRESS_PATTERN = r"((https?|ray)://)?[A-Za-z0-9_.\-\[\]:]+(:\d+)?(/[^\s]*)?"
# How Ray's job manager words a job whose supervisor actor died with its node (JOB_SUPERVISOR_ACTOR_DIED).
NODE_DIED = re.compile(r"its node has died\. Node Id: (?P<node>\w+)(?P<cause>.*)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RaySettings:
    address: str | None = None  # None: $RAY_ADDRESS (the dashboard address, http://HOST:8265)
    entrypoint_num_cpus: float | None = None
    entrypoint_num_gpus: float | None = None

    def __post_init__(self) -> None:
        if self.address is not None:
            check_launcher_string("ray.address", self.address, ADDRESS_PATTERN,
                                  "a Ray dashboard address, http://HOST:8265 (or https://..., ray://HOST:PORT, "
                                  "HOST:PORT)")
        for name in ("entrypoint_num_cpus", "entrypoint_num_gpus"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"ray.{name}", value, minimum=0.0)


@LAUNCHERS.register("ray")
class RayLauncher(Launcher):
    settings = RaySettings
    poll_every_s = 1.0  # each poll is an HTTP request to the dashboard

    @classmethod
    def from_config(cls, settings: Any, sweep_dir: Path, sweep: str, parallelism: int) -> Launcher:
        return cls(settings or RaySettings(), sweep)

    def __init__(self, settings: RaySettings, sweep: str) -> None:
        from ray.job_submission import JobSubmissionClient

        self.address = settings.address or os.environ.get("RAY_ADDRESS")
        if not self.address:
            raise ConfigError("ray.address = None is not allowed with launcher=ray when RAY_ADDRESS is unset: give "
                              "ray.address=http://HOST:8265 (the Ray dashboard) or export RAY_ADDRESS")
        try:
            self.client = JobSubmissionClient(self.address)
        except Exception as error:  # noqa: BLE001  (any connection problem refuses the sweep with its reason)
            reason = str(error).strip().splitlines()[0]
            hint = ("; the cluster uses Ray's token authentication: run the sweep with RAY_AUTH_MODE=token and the "
                    "cluster's token in RAY_AUTH_TOKEN or ~/.ray/auth_token"
                    if "authentication" in reason.lower() else "")
            raise ConfigError(f"ray.address = {self.address!r} is not allowed: no Ray dashboard answers there "
                              f"({reason}){hint}") from None
        self.settings, self.sweep, self.cwd = settings, sweep, os.getcwd()
        self._last_poll: dict[str, float] = {}

    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        options = {name: getattr(self.settings, name) for name in ("entrypoint_num_cpus", "entrypoint_num_gpus")
                   if getattr(self.settings, name) is not None}
        jobs = []
        for run in runs:
            job_id = self.client.submit_job(
                entrypoint=f"cd {shlex.quote(self.cwd)} && exec {shlex.join(run.command)}",
                submission_id=f"{self.sweep}-{run.name}-{uuid.uuid4().hex[:8]}",
                runtime_env={"env_vars": dict(run.env)}, metadata={"sweep": self.sweep, "run": run.name}, **options)
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
        try:  # the job's logs, appended to the run's log
            logs = self.client.get_job_logs(job.handle)
        except Exception as error:  # noqa: BLE001  (missing logs must not lose the run's outcome)
            lines = [line for line in str(error).splitlines() if re.search(r"\w{3}", line)] or [repr(error)]
            logs = f"(could not fetch the Ray job's logs: {lines[-1].strip()})\n"  # its node may be gone
        job.run.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(job.run.log_path, "a", encoding="utf-8") as log:
            log.write(logs)
        died = NODE_DIED.search(info.message or "") if info.status == JobStatus.FAILED else None
        if died:  # the job's node was lost (its machine died, its raylet was killed): the run did not fail
            return Outcome(info.driver_exit_code, f"Ray job {job.handle} FAILED: the node running it died (Ray: "
                                                  f"node {died['node']}: {' '.join(died['cause'].split())}); the run "
                                                  f"keeps its last checkpoint and resumes when the sweep is run again",
                           interrupted=True)
        code = info.driver_exit_code
        if code is None:
            code = {JobStatus.SUCCEEDED: 0, JobStatus.STOPPED: 130}.get(info.status, 1)
        if info.status == JobStatus.SUCCEEDED:
            return Outcome(code)
        return Outcome(code, f"Ray job {job.handle} {info.status.value}: {(info.message or '').strip()}")

    def terminate(self, job: Job) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_job(job.handle)

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        from ray.job_submission import JobStatus

        job_id = info.get("job_id")
        if not job_id or info.get("address") != self.address:
            return False
        try:
            return self.client.get_job_status(job_id) in (JobStatus.PENDING, JobStatus.RUNNING)
        except Exception:  # noqa: BLE001  (an unknown job is not running)
            return False

