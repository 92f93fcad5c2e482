"""``runs/<sweep>/sweep.json``: the grid, each run's exact command line and state, written atomically.

Layout::

    {"sweep": name, "backend": "local", "launcher": "local", "created": iso, "updated": iso,
     "state": "running" | "completed" | "failed" | "interrupted",
     "grid": {"alpha": [...], "seed": [...], "mechanism": [...], "eta": [...], "axes": {...},
              "common_overrides": [...]},
     "jobs": int, "threads": int | null, "invocations": [{"argv": [...], "start": iso, "end": iso, "exit_code": int}],
     "warm_starts": [<entry>], "runs": [<entry>, ...]}

    <entry> = {"run": name, "alpha": float | null, "seed": int, "mechanism_label": str | null, "eta": float | null,
               "axes": {key: value}, "backend": str, "state": "pending" | "running" | "completed" | "failed" |
               "interrupted", "command": [argv], "env": {VAR: value}, "exit_code": int | null, "start": iso | null,
               "end": iso | null, "wall_time_s": float (summed over attempts), "attempts": int,
               "log": "logs/<run>.log" (relative to the sweep folder), "run_dir": "<run>" (relative),
               "launch": {"pid": int} | {"job_id": str} | {}, "error": str | null}

Runs of an earlier invocation that are not in the current grid stay in ``runs`` untouched.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dataflex_rl.tracking.run_store import atomic_write_json

MANIFEST_FILE = "sweep.json"
RUN_STATES = ("pending", "running", "completed", "failed", "interrupted")


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    path = sweep_dir / MANIFEST_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


class Manifest:
    """The in-memory sweep.json of one invocation; :meth:`save` writes it atomically after every change."""

    def __init__(self, sweep_dir: Path, header: Mapping[str, Any]) -> None:
        self.sweep_dir = sweep_dir
        previous = read_manifest(sweep_dir) or {}
        now = utc_now()
        self.data: dict[str, Any] = {
            **header,
            "created": previous.get("created", now),
            "updated": now,
            "state": "running",
            "invocations": list(previous.get("invocations", [])),
            "warm_starts": list(previous.get("warm_starts", [])),
            "runs": list(previous.get("runs", [])),
            **({"plan": previous["plan"]} if "plan" in previous else {}),  # a seed plan (sweeps.planning) stays
        }
        self._by_name = {entry["run"]: entry for entry in self.data["runs"]}

    def previous(self, name: str) -> dict[str, Any] | None:
        return self._by_name.get(name)

    def entry(self, name: str, fields: Mapping[str, Any], warm_start: bool = False) -> dict[str, Any]:
        """The entry of run ``name`` (created after the last one when new), updated with ``fields``."""
        section = self.data["warm_starts"] if warm_start else self.data["runs"]
        for entry in section:
            if entry["run"] == name:
                entry.update(fields)
                return entry
        entry = {"run": name, "state": "pending", "exit_code": None, "start": None, "end": None, "wall_time_s": 0.0,
                 "attempts": 0, "launch": {}, "error": None, **fields}
        section.append(entry)
        if not warm_start:
            self._by_name[name] = entry
        return entry

    def save(self) -> None:
        self.data["updated"] = utc_now()
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.sweep_dir / MANIFEST_FILE, self.data)
