"""``runs/<sweep>/sweep.json``: the grid, each run's exact command line and state, written atomically.

Layout::

    {"sweep": name, "backend": "local", "launcher": "process", "warm_start": "per_seed" | "shared",
     "created": iso, "updated": iso,
     "state": "running" | "completed" | "failed" | "interrupted",
     "grid": {"alpha": [...], "seed": [...], "mechanism": [...], "eta": [...], "axes": {...},
              "common_overrides": [...]},
     "jobs": int, "threads": int | null, "invocations": [{"argv": [...], "start": iso, "end": iso, "exit_code": int}],
     "warm_starts": [<entry>], "runs": [<entry>, ...]}

    <entry> = {"run": name, "alpha": float | null, "seed": int, "mechanism_label": str | null, "eta": float | null,
               "axes": {key: value}, "backend": str, "state": "pending" | "running" | "completed" | "failed" |
               "interrupted", "command": [argv], "overrides": [...], "env": {VAR: value}, "exit_code": int | null,
               "start": iso | null, "end": iso | null, "wall_time_s": float (summed over attempts), "attempts": int,
               "log": "logs/<run>.log" (relative to the sweep folder), "run_dir": "<run>" (relative),
               "launch": {"pid": int} | {"job_id": str} | {}, "error": str | null}

Runs of an earlier invocation that are not in the current grid stay in ``runs`` untouched.

A sweep name stands for one set of settings: its ``backend``, ``train_module``, ``steps``, ``warm_start`` (the
warm-start design: growing a sweep keeps it) and the resolved train
config its common overrides give (``grid.common_config``, flattened, without the keys that cannot change a run's
numbers; the text of ``grid.common_overrides`` where the record has no resolved config), hashed into
``fingerprint``. Running the name again with other settings is refused
(:class:`SweepMismatchError`, naming each differing setting); running it with more alphas, seeds, mechanisms, eta or
extra-axis values and the same settings grows the sweep (only the new runs start). A new axis (an extra axis, or
mechanisms/alpha/eta where the sweep had none) or a dropped one is refused the same way, naming it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.overrides import parse_override
from dataflex_rl.validation import ConfigError
from dataflex_rl.tracking.run_store import (
    COMPLETED,
    FAILED,
    INTERRUPTED,
    STATES,
    SWEEP_FILE,
    RunStoreError,
    atomic_write_json,
    read_sweep_record,
    utc_now,
)

RUN_STATES = STATES
# Header fields that fix a sweep's numbers besides its axes (and the common overrides in ``grid``).
SETTING_FIELDS = ("backend", "train_module", "steps", "warm_start")


class SweepMismatchError(ConfigError):
    """A sweep name run again with settings that differ from the recorded ones."""


class ManifestError(ConfigError):
    """A ``sweep.json`` that cannot be read (cut short, edited by hand)."""


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    """``sweep.json`` of ``sweep_dir``, None when absent; :class:`ManifestError` naming the file when damaged."""
    try:
        return read_sweep_record(sweep_dir)
    except RunStoreError as error:
        raise ManifestError(f"{error}: restore it, or move it away to start the sweep's record afresh (the run "
                            f"folders keep their results)") from None


def _override_settings(overrides: Any) -> dict[str, str | None]:
    """``["trainer.lr=0.5", "++x=1"]`` -> ``{"trainer.lr": "0.5", "x": "1"}`` (read by Hydra's grammar; the
    ``+``/``++`` prefix dropped)."""
    parsed = [parse_override(str(item)) for item in overrides or []]
    return {item.key: item.value for item in parsed}


def _has_common_config(header: Mapping[str, Any]) -> bool:
    grid = header.get("grid")
    return isinstance(grid, Mapping) and isinstance(grid.get("common_config"), Mapping)


def sweep_settings(header: Mapping[str, Any], resolved: bool | None = None) -> dict[str, Any]:
    """The settings of a sweep header that fix its numbers besides the axes: :data:`SETTING_FIELDS` present in
    the header, then the resolved common config as ``config <key>`` (``grid.common_config``, local backend), or
    each common override's text as ``override <key>`` (``resolved=False``, or a header without a resolved config)."""
    settings: dict[str, Any] = {field: header[field] for field in SETTING_FIELDS if field in header}
    grid = header.get("grid")
    if resolved is None:
        resolved = _has_common_config(header)
    if resolved and _has_common_config(header):
        for key, value in grid["common_config"].items():
            settings[f"config {key}"] = value
    elif isinstance(grid, Mapping):
        for key, value in _override_settings(grid.get("common_overrides")).items():
            settings[f"override {key}"] = value
    return settings


def sweep_fingerprint(header: Mapping[str, Any]) -> str:
    """16 hex digits of sha256 over :func:`sweep_settings` (canonical JSON)."""
    canonical = json.dumps(sweep_settings(header), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# Axes of the grid besides the extra ones: sweep.json's grid list -> the name messages use.
GRID_AXES = (("mechanism", "mechanisms"), ("alpha", "alpha"), ("eta", "eta"))


def grid_axes(header: Mapping[str, Any]) -> list[str]:
    """The axes a sweep header's grid varies besides the seed: ``mechanisms``, ``alpha`` and ``eta`` when listed, then
    each extra axis's key; empty for a header without a grid (a study's, :func:`sweeps.tune.study_header`)."""
    grid = header.get("grid")
    if not isinstance(grid, Mapping):
        return []
    named = [name for field, name in GRID_AXES if grid.get(field)]
    return [*named, *map(str, grid.get("axes") or {})]


def check_sweep_axes(sweep_dir: Path, previous: Mapping[str, Any], header: Mapping[str, Any]) -> None:
    """A sweep grows only along its recorded axes (more values, more seeds): an axis added or dropped would put runs
    of another design into the same record, which its report cannot pair. Raises :class:`SweepMismatchError` naming
    each added and dropped axis."""
    before, after = grid_axes(previous), grid_axes(header)
    added = [axis for axis in after if axis not in before]
    dropped = [axis for axis in before if axis not in after]
    if added or dropped:
        changes = "; ".join([*(f"new axis {axis}" for axis in added), *(f"axis {axis} dropped" for axis in dropped)])
        raise SweepMismatchError(
            f"sweep {sweep_dir.name} was run along the axes {', '.join(before) or '(seed only)'} (and seed); now: "
            f"{changes}. A sweep grows only along its own axes (more values, more seeds): give the new design a new "
            f"sweep name"
        )


def check_sweep_settings(sweep_dir: Path, previous: Mapping[str, Any], header: Mapping[str, Any]) -> None:
    """Refuse running ``sweep_dir`` with ``header`` when its settings differ from the recorded ``previous`` ones.

    A field missing from a header reads as ``<absent>`` (a study's header has no ``steps``); common overrides are
    compared when both headers have a grid. Raises :class:`SweepMismatchError` naming each differing setting, recorded and new value.
    """
    absent = "<absent>"
    # resolved configs when both headers have one (as a run's resume compares them), else the overrides' text
    resolved = _has_common_config(previous) and _has_common_config(header)
    before, after = sweep_settings(previous, resolved), sweep_settings(header, resolved)
    compared = set(SETTING_FIELDS)
    if isinstance(previous.get("grid"), Mapping) and isinstance(header.get("grid"), Mapping):
        compared |= {key for key in before.keys() | after.keys() if key.startswith(("config ", "override "))}
    differences = [(key, before.get(key, absent), after.get(key, absent)) for key in sorted(compared)
                   if before.get(key, absent) != after.get(key, absent)]
    if differences:
        listed = "; ".join(f"{key}: recorded {old!r}, now {new!r}" for key, old, new in differences)
        raise SweepMismatchError(
            f"sweep {sweep_dir.name} was run with other settings: {listed}. Its runs' results come from the recorded "
            f"ones: use them again (adding alphas, seeds or axis values is fine), or give the new settings a new "
            f"sweep name"
        )


def save_plan(sweep_dir: Path, plan: Mapping[str, Any]) -> None:
    """Record a seed plan (:mod:`sweeps.planning`) under ``plan`` in sweep.json, atomically, the rest of the record
    untouched; :class:`Manifest` keeps it in later invocations."""
    data = read_manifest(sweep_dir) or {}
    data["plan"] = dict(plan)
    atomic_write_json(sweep_dir / SWEEP_FILE, data)


def final_state(exit_code: int) -> str:
    """The sweep's recorded state after an invocation that ended with ``exit_code``."""
    return INTERRUPTED if exit_code > 128 else FAILED if exit_code else COMPLETED


class Manifest:
    """The in-memory sweep.json of one invocation; :meth:`save` writes it atomically after every change.

    Raises :class:`SweepMismatchError` when the recorded sweep has other settings (see the module doc) and
    :class:`ManifestError` when the recorded sweep.json is damaged: nothing is written then.
    """

    def __init__(self, sweep_dir: Path, header: Mapping[str, Any]) -> None:
        self.sweep_dir = sweep_dir
        previous = read_manifest(sweep_dir) or {}
        if previous:
            check_sweep_settings(sweep_dir, previous, header)
            check_sweep_axes(sweep_dir, previous, header)
        now = utc_now()
        self.data: dict[str, Any] = {
            **header,
            "fingerprint": sweep_fingerprint(header),
            "created": previous.get("created", now),
            "updated": now,
            "state": "running",
            "invocations": list(previous.get("invocations", [])),
            "warm_starts": list(previous.get("warm_starts", [])),
            "runs": list(previous.get("runs", [])),
            **({"plan": previous["plan"]} if "plan" in previous else {}),  # a seed plan (sweeps.planning) stays
        }
        self._by_name = {entry["run"]: entry for entry in self.data["runs"]}
        self._invocation: dict[str, Any] = {}

    def previous(self, name: str) -> dict[str, Any] | None:
        """The recorded entry of run ``name`` (None when the sweep never listed it)."""
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

    def begin_invocation(self, argv: Sequence[str]) -> None:
        """Append this invocation's record: its argv and start (its end comes with :meth:`end_invocation`)."""
        self._invocation = {"argv": list(argv), "start": utc_now(), "end": None, "exit_code": None}
        self.data["invocations"].append(self._invocation)

    def end_invocation(self, exit_code: int) -> None:
        """Record the sweep's state after this invocation (:func:`final_state`) and the invocation's end and exit
        code, and save."""
        self.data["state"] = final_state(exit_code)
        self._invocation.update(end=utc_now(), exit_code=exit_code)
        self.save()

    def save(self) -> None:
        """Write sweep.json atomically, stamped ``updated`` now."""
        self.data["updated"] = utc_now()
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.sweep_dir / SWEEP_FILE, self.data)
