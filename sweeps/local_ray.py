"""A Ray cluster of a head and N worker nodes on this machine, to try ``launcher=ray`` and to test it:
``python -m sweeps.local_ray start|kill|stop --dir DIR``; ``stop`` stops only this cluster's processes (``ray stop``
would stop every Ray process of the user): those whose environment holds the cluster's own ``RAY_TMPDIR`` (a fresh
temp folder), and their children. See docs/sweeps.md, "SLURM and Ray in practice"."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dataflex_rl.validation import ConfigError, check_int_at_least, check_number

REPO = Path(__file__).resolve().parents[1]
STATE_FILE = "cluster.json"
TEMP_ROOT, TEMP_PREFIX = Path("/tmp"), "ray"  # each cluster's own temp folder, /tmp/ray<random>


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_cluster_dir(directory: Path) -> Path:
    """``directory`` unless it names something that is not a folder (a cluster's folder is created when missing)."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--dir {directory} is not allowed: it is not a folder; give a folder for the cluster's "
                          f"files (created when missing)")
    return directory


def _processes() -> dict[int, tuple[int | None, str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if stat[0] != "Z":
                found[int(entry.name)] = (int(stat[1]), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace"))
    return found


def start(directory: Path, workers: int = 1, cpus_per_node: float = 1,
          env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``env`` is added to the nodes' environment, which every job inherits; returns the state."""
    check_int_at_least("--workers", workers, 0)
    check_number("--cpus-per-node", cpus_per_node, minimum=0.0, exclusive=True)
    if (check_cluster_dir(directory) / STATE_FILE).exists():
        raise ConfigError(f"--dir {directory} is not allowed: it holds a cluster already ({STATE_FILE}); stop it "
                          f"first: python -m sweeps.local_ray stop --dir {directory}")
    ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray is None:
        raise RuntimeError("the ray CLI is not installed: pip install 'ray[default]'")
    directory.mkdir(parents=True, exist_ok=True)
    gcs_port, dashboard_port = free_port(), free_port()
    # One short temp dir for all nodes: workers read job logs from the head's session folder; socket paths are short.
    temp_dir = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_ROOT)
    state: dict[str, Any] = {"address": f"http://127.0.0.1:{dashboard_port}", "gcs_address": f"127.0.0.1:{gcs_port}",
                             "temp_dir": temp_dir, "nodes": {}}
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",  # a ~/.ray/auth_token would switch token auth on otherwise
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    for index in range(workers + 1):
        name = f"worker{index}" if index else "head"
        node_port = free_port()
        state["nodes"][name] = {"node_manager_port": node_port}
        where = ["--head", f"--port={gcs_port}", f"--dashboard-port={dashboard_port}", "--include-dashboard=true",
                 "--dashboard-host=127.0.0.1", f"--ray-client-server-port={free_port()}"] if not index else [
                 f"--address={state['gcs_address']}"]
        command = [ray, "start", *where, "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
                   f"--num-cpus={cpus_per_node:g}", f"--resources={json.dumps({name: 1})}",
                   f"--node-manager-port={node_port}", f"--dashboard-agent-listen-port={free_port()}",
                   "--disable-usage-stats"]
        (directory / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        started = subprocess.run(command, env={**env, "RAY_TMPDIR": temp_dir}, capture_output=True, text=True,
                                 timeout=180, check=False)
        if started.returncode != 0:
            stop(directory)
            raise RuntimeError(f"ray start of the {name} node failed:\n{started.stdout}{started.stderr}")
    return state


def read_state(directory: Path) -> dict[str, Any]:
    """The state :func:`start` wrote, checked: its temp folder is one ``start`` made (``stop`` deletes it)."""
    try:
        state = json.loads((directory / STATE_FILE).read_text())
        temp_dir, nodes = Path(str(state["temp_dir"])), state["nodes"]
        if temp_dir.parent != TEMP_ROOT or not temp_dir.name.startswith(TEMP_PREFIX) or not isinstance(nodes, dict):
            raise ValueError(f"temp_dir {str(temp_dir)!r} is not a folder `sweeps.local_ray start` made")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"--dir {directory} holds no cluster started by `sweeps.local_ray start`: "
                           f"{directory / STATE_FILE}: {error}") from None
    return state


def cluster_pids(state: Mapping[str, Any]) -> set[int]:
    """The cluster's processes: those whose environment holds its ``RAY_TMPDIR`` (what :func:`start` gave every
    node), and all below them; never this one."""
    marker = f"RAY_TMPDIR={state['temp_dir']}".encode()
    processes = _processes()
    pids = set()
    for pid in processes:
        with contextlib.suppress(OSError):
            if marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                pids.add(pid)
    while more := {pid for pid, (parent, _) in processes.items() if parent in pids and pid not in pids}:
        pids |= more
    return pids - {os.getpid()}


def raylet_pid(directory: Path, node: str) -> int | None:
    state = read_state(directory)
    nodes = state["nodes"]
    if node not in nodes:
        raise RuntimeError(f"--node {node!r} is not allowed: this cluster's nodes are {', '.join(nodes)}")
    marker, ours = f"--node_manager_port={nodes[node]['node_manager_port']}", cluster_pids(state)
    return next((pid for pid, (_, line) in _processes().items()
                 if pid in ours and "raylet" in line and marker in line), None)


def kill_node(directory: Path, node: str) -> int:
    pid = raylet_pid(directory, node)
    if pid is None:
        raise RuntimeError(f"node {node}'s raylet is not running")
    os.kill(pid, signal.SIGKILL)
    return pid


def stop(directory: Path, grace_s: float = 3.0) -> int:
    state = read_state(directory)
    pids = cluster_pids(state)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pids & set(_processes()):
        time.sleep(0.2)
    for pid in pids & set(_processes()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(state["temp_dir"], ignore_errors=True)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return len(pids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.local_ray", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "kill", "stop"])
    parser.add_argument("--dir", type=Path, required=True, help="where the cluster's state (cluster.json) is kept")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cpus-per-node", type=float, default=1)
    parser.add_argument("--node", default="worker1", help="the node `kill` kills")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            state = start(args.dir, args.workers, args.cpus_per_node)
            print(f"Ray cluster up ({', '.join(state['nodes'])}): export RAY_ADDRESS={state['address']}  "
                  f"(or ray.address={state['address']}); stop: python -m sweeps.local_ray stop --dir {args.dir}")
        elif args.action == "kill":
            print(f"killed node {args.node}'s raylet (pid {kill_node(args.dir, args.node)})")
        else:
            print(f"stopped {stop(args.dir)} process(es)")
    except (ConfigError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
