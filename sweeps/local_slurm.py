"""A one-node SLURM on this machine, to try ``launcher=slurm`` and to test against (needs root and Debian's
``slurm-wlm`` and ``munge``, installed when missing): ``python -m sweeps.local_slurm start|stop --dir DIR``, then
``export SLURM_CONF=DIR/slurm.conf``. See docs/sweeps.md, "SLURM and Ray in practice"."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sweeps.local_ray import free_port  # one implementation for both local clusters

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
PARTITION = "debug"


def missing_reason() -> str | None:
    if all(shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") for name in (*DAEMONS, "sbatch")):
        return None if os.geteuid() == 0 else "SLURM's daemons need root here (slurmd runs jobs as any user)"
    if os.geteuid() != 0:
        return "slurm-wlm and munge are not installed, and installing them needs root"
    if shutil.which("apt-get") is None:
        return "slurm-wlm and munge are not installed, and there is no apt-get to install them"
    return None


def install() -> None:
    if all(shutil.which(name, path="/usr/sbin:/usr/bin") for name in (*DAEMONS, "sbatch")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")


def slurm_conf(folder: Path, cpus: int, memory_mb: int) -> str:
    host = socket.gethostname().split(".")[0]
    lines = {
        "ClusterName": "local", "SlurmctldHost": f"{host}(127.0.0.1)", "SlurmctldPort": free_port(),
        "SlurmdPort": free_port(), "SlurmUser": "root", "SlurmdUser": "root", "AuthType": "auth/munge",
        "AuthInfo": f"socket={folder / 'munge' / 'munge.socket'}", "CredType": "cred/munge",
        "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none", "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core_Memory", "SchedulerType": "sched/backfill",
        "StateSaveLocation": folder / "state", "SlurmdSpoolDir": folder / "spool",
        "SlurmctldPidFile": folder / "slurmctld.pid", "SlurmdPidFile": folder / "slurmd.pid",
        "SlurmctldLogFile": folder / "log" / "slurmctld.log", "SlurmdLogFile": folder / "log" / "slurmd.log",
        "AccountingStorageType": "accounting_storage/none", "JobAcctGatherType": "jobacct_gather/none",
        "JobCompType": "jobcomp/none", "MpiDefault": "none", "ReturnToService": 2, "KillWait": 10,
        "MinJobAge": 300, "SchedulerParameters": "sched_interval=2",
    }
    text = "".join(f"{key}={value}\n" for key, value in lines.items())
    return (text + f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN\n"
            f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP\n")


def start(folder: Path, cpus: int | None = None, memory_mb: int | None = None, timeout_s: float = 30.0) -> Path:
    """Returns the slurm.conf path (what ``SLURM_CONF`` takes)."""
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(f"cannot start a local SLURM: {reason}")
    install()
    folder = folder.resolve()
    for sub in ("munge", "state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    key = folder / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
    cpus = cpus or os.cpu_count() or 1
    memory_mb = memory_mb or int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, cpus, memory_mb))
    munge = folder / "munge"
    subprocess.run(["munged", "--force", f"--socket={munge / 'munge.socket'}", f"--key-file={key}",
                    f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}"], check=True)
    subprocess.run(["slurmctld", "-f", str(conf)], check=True)
    subprocess.run(["slurmd", "-f", str(conf)], check=True)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, check=False)
        if state.stdout.strip() == "idle":
            return conf
        time.sleep(0.3)
    stop(folder)
    raise RuntimeError(f"the local SLURM did not come up within {timeout_s:g} s; see {folder / 'log'}")


def stop(folder: Path) -> None:
    folder = folder.resolve()
    stopped = []
    for pid_file in (folder / "slurmd.pid", folder / "slurmctld.pid", folder / "munge" / "munged.pid"):
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue
        stopped.append(pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in stopped):
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.local_slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, required=True, help="the cluster's folder (config, state, logs)")
    parser.add_argument("--cpus", type=int, help="the node's CPUs (default: this machine's)")
    parser.add_argument("--memory-mb", type=int, help="the node's memory (default: 80%% of this machine's)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        stop(args.dir)
        return 0
    try:
        conf = start(args.dir, args.cpus, args.memory_mb)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(error, file=sys.stderr)
        return 1
    print(f"local SLURM up; partition {PARTITION!r}. Use it with:\n  export SLURM_CONF={conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
