"""``launcher=process``: each run a child process of the driver, in its own session (a terminal's Ctrl-C reaches
only the driver, which stops the runs itself); on Linux a child gets SIGTERM when the driver dies
(``PR_SET_PDEATHSIG``), so no run outlives a hard-killed driver."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from sweeps.launchers.base import LAUNCHERS, Job, Launcher, Outcome, RunToLaunch, process_matches

_PR_SET_PDEATHSIG = 1
# prctl(PR_SET_PDEATHSIG, SIGTERM) from the C library this process has loaded already (dlopen(NULL)); Linux only.
_DIE_WITH_PARENT = (functools.partial(ctypes.CDLL(None).prctl, _PR_SET_PDEATHSIG, signal.SIGTERM)
                    if sys.platform == "linux" else None)


@LAUNCHERS.register("process")
class ProcessLauncher(Launcher):
    runs_here = True

    def launch(self, runs: Sequence[RunToLaunch]) -> list[Job]:
        jobs = []
        for run in runs:
            run.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(run.log_path, "ab") as log:
                process = subprocess.Popen(
                    list(run.command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **run.env}, start_new_session=True,
                    preexec_fn=_DIE_WITH_PARENT,  # noqa: PLW1509  (this launcher's driver starts no threads)
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

    def still_running(self, info: Mapping[str, Any], run: RunToLaunch) -> bool:
        pid = info.get("pid")  # the same pid running the run's own command (a stopped process too)
        return isinstance(pid, int) and process_matches(pid, " ".join(run.command))
