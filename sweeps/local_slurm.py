"""A one-node SLURM on this machine, to try ``launcher=slurm`` and to test against (needs root and Debian's
``slurm-wlm`` and ``munge``, installed when missing): ``python -m sweeps.local_slurm start|stop --dir DIR``, then
``export SLURM_CONF=DIR/slurm.conf``. ``stop`` signals only the processes that run this folder's own daemon
commands (a pid file may name anyone's process once its daemon is gone). See docs/sweeps.md, "SLURM and Ray in
practice"."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from dataflex_rl.validation import ConfigError, check_int_in_range
from sweeps.local_ray import check_cluster_dir, free_port  # one implementation for both local clusters

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


def daemon_commands(folder: Path) -> dict[str, list[str]]:
    """The command ``start`` runs each daemon with, in start order (``folder`` resolved)."""
    munge, conf = folder / "munge", str(folder / "slurm.conf")
    return {"munged": ["munged", "--force", f"--socket={munge / 'munge.socket'}", f"--key-file={munge / 'munge.key'}",
                       f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                       f"--seed-file={munge / 'munged.seed'}"],
            "slurmctld": ["slurmctld", "-f", conf], "slurmd": ["slurmd", "-f", conf]}


def process_argv(pid: int) -> list[str] | None:
    """A process's command line as its argument list (None when it is gone or unreadable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return None


def running_daemons(folder: Path) -> dict[int, str]:
    """pid -> name of every process that runs one of this folder's daemon commands, slurmd's first. Pid files are
    never read: a stale one may name any process by now."""
    commands = {tuple(command): name for name, command in daemon_commands(folder.resolve()).items()}
    found = {int(entry.name): commands.get(tuple(process_argv(int(entry.name)) or ()))
             for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    order = list(reversed(commands.values()))
    return dict(sorted(((pid, name) for pid, name in found.items() if name), key=lambda item: order.index(item[1])))


def start(folder: Path, cpus: int | None = None, memory_mb: int | None = None, timeout_s: float = 30.0) -> Path:
    """Returns the slurm.conf path (what ``SLURM_CONF`` takes). Refused (ConfigError) before anything starts for bad
    arguments or while this folder's cluster runs; a start that fails stops what it started."""
    # slurmd drains a node said to have more than this machine has: the cluster never came up
    machine_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    for key, value, most in (("--cpus", cpus, os.cpu_count() or 1), ("--memory-mb", memory_mb, machine_mb)):
        if value is not None:
            check_int_in_range(key, value, 1, most)
    folder = check_cluster_dir(folder).resolve()
    if re.search(r"[\s#=]", str(folder)):  # slurm.conf's values end at whitespace; '#' starts a comment
        raise ConfigError(f"--dir {str(folder)!r} is not allowed: slurm.conf names paths inside it, and cannot hold "
                          f"whitespace, '#' or '='; give a folder whose path has none")
    cpus, memory_mb = cpus or os.cpu_count() or 1, memory_mb or int(machine_mb * 0.8)
    running = running_daemons(folder)
    if running:
        raise ConfigError(f"--dir {folder} is not allowed: its local SLURM runs ("
                          f"{', '.join(f'{name} pid {pid}' for pid, name in running.items())}); stop it first: "
                          f"python -m sweeps.local_slurm stop --dir {folder}")
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(f"cannot start a local SLURM: {reason}")
    install()
    try:
        return _start(folder, cpus, memory_mb, timeout_s)
    except BaseException:
        stop(folder)
        raise


def _start(folder: Path, cpus: int, memory_mb: int, timeout_s: float) -> Path:
    for sub in ("munge", "state", "spool", "log"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    key = folder / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, cpus, memory_mb))
    for command in daemon_commands(folder).values():
        subprocess.run(command, check=True)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True, check=False)
        if state.stdout.strip() == "idle":
            return conf
        time.sleep(0.3)
    raise RuntimeError(f"the local SLURM did not come up within {timeout_s:g} s; see {folder / 'log'}")


def stop(folder: Path) -> dict[int, str]:
    """SIGTERM this folder's running daemons (:func:`running_daemons`), slurmd first; the ones signalled."""
    stopped = running_daemons(folder)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and running_daemons(folder):
        time.sleep(0.1)
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.local_slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", type=Path, required=True, help="the cluster's folder (config, state, logs)")
    parser.add_argument("--cpus", type=int, help="the node's CPUs (default: this machine's)")
    parser.add_argument("--memory-mb", type=int, help="the node's memory (default: 80%% of this machine's)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        stopped = stop(args.dir)
        print(f"stopped {', '.join(f'{name} (pid {pid})' for pid, name in stopped.items())}" if stopped else
              f"no daemon of a local SLURM in {args.dir} runs: nothing stopped")
        return 0
    try:
        conf = start(args.dir, args.cpus, args.memory_mb)
    except ConfigError as error:
        print(f"error: start refused, nothing was started: {error}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError, subprocess.CalledProcessError) as error:
        print(f"error: {error}; what had started is stopped", file=sys.stderr)
        return 1
    print(f"local SLURM up; partition {PARTITION!r}. Use it with:\n  export SLURM_CONF={conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
