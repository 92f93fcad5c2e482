"""``runs/<sweep>/sweep.json``: the grid, each run's exact command line and state, written atomically (layout in
docs/sweeps.md). A sweep name stands for one set of settings (:func:`sweep_settings`, hashed into ``fingerprint``):
running it again with other settings, or along other axes, is refused (:class:`SweepMismatchError`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.hashing import stable_hash
from dataflex_rl.overrides import parse_override
from dataflex_rl.tracking.identity import SAME_ARM_RELATIVE, same_arm
from dataflex_rl.validation import ConfigError
from dataflex_rl.tracking.run_store import (COMPLETED, FAILED, INTERRUPTED, PENDING, RUNNING, SWEEP_FILE, RunStoreError,
                                            atomic_write_json, read_sweep_record, utc_now)

# Header fields that fix a sweep's numbers besides its axes (and the common overrides in ``grid``).
SETTING_FIELDS = ("backend", "train_module", "steps", "warm_start", "backend_settings")


class SweepMismatchError(ConfigError):
    pass


class ManifestError(ConfigError):
    pass


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    try:
        return read_sweep_record(sweep_dir)
    except RunStoreError as error:
        raise ManifestError(f"{error}: restore it, or move it away to start the sweep's record afresh (the run "
                            f"folders keep their results)") from None


def _has_common_config(header: Mapping[str, Any]) -> bool:
    grid = header.get("grid")
    return isinstance(grid, Mapping) and isinstance(grid.get("common_config"), Mapping)


def sweep_settings(header: Mapping[str, Any], resolved: bool | None = None) -> dict[str, Any]:
    """SETTING_FIELDS, then the resolved common config (``config <key>``) or overrides (``override <key>``)."""
    settings: dict[str, Any] = {field: header[field] for field in SETTING_FIELDS if field in header}
    grid = header.get("grid")
    if resolved is not False and _has_common_config(header):
        settings.update({f"config {key}": value for key, value in grid["common_config"].items()})
    elif isinstance(grid, Mapping):
        for item in grid.get("common_overrides") or []:
            override = parse_override(str(item))
            settings[f"override {override.key}"] = override.value
    return settings


# Axes of the grid besides the extra ones: sweep.json's grid list -> the name messages use.
GRID_AXES = (("mechanism", "mechanisms"), ("alpha", "alpha"), ("eta", "eta"))


def grid_axes(header: Mapping[str, Any]) -> list[str]:
    """The axes a header's grid varies besides the seed (none for a study)."""
    grid = header.get("grid")
    if not isinstance(grid, Mapping):
        return []
    return [*(name for field, name in GRID_AXES if grid.get(field)), *map(str, grid.get("axes") or {})]


def check_sweep_axes(sweep_dir: Path, previous: Mapping[str, Any], header: Mapping[str, Any]) -> None:
    """A sweep grows only along its recorded axes (its report could not pair the runs otherwise)."""
    before, after = grid_axes(previous), grid_axes(header)
    added = [axis for axis in after if axis not in before]
    dropped = [axis for axis in before if axis not in after]
    if added or dropped:
        changes = "; ".join([*(f"new axis {axis}" for axis in added), *(f"axis {axis} dropped" for axis in dropped)])
        raise SweepMismatchError(
            f"sweep {sweep_dir.name} was run along the axes {', '.join(before) or '(seed only)'} (and seed); now: "
            f"{changes}. A sweep grows only along its own axes (more values, more seeds): give the new design a new "
            f"sweep name")


def axis_values(header: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Each axis of a header's grid (``alpha``, ``eta``, the extra axes by key) with its values."""
    grid = header.get("grid") if isinstance(header.get("grid"), Mapping) else {}
    axes = grid.get("axes") if isinstance(grid.get("axes"), Mapping) else {}
    return {**{name: list(grid.get(name) or []) for name in ("alpha", "eta")},
            **{str(key): list(values or []) for key, values in axes.items()}}


def check_sweep_values(sweep_dir: Path, previous: Mapping[str, Any], header: Mapping[str, Any]) -> None:
    """A value that grows a sweep is a new arm or a recorded one, never one the arm rule cannot tell from it."""
    recorded = axis_values(previous)
    for axis, values in axis_values(header).items():
        for value in values:
            close = [old for old in recorded.get(axis, []) if same_arm(value, old) and value != old]
            if close:
                raise SweepMismatchError(
                    f"{axis} = {value!r} is not allowed: sweep {sweep_dir.name} has the arm {axis} = {close[0]!r}, "
                    f"which the arm rule cannot tell from it (within a relative {SAME_ARM_RELATIVE:g}); give "
                    f"{close[0]!r} to grow that arm, or a value that differs more")


def check_sweep_settings(sweep_dir: Path, previous: Mapping[str, Any], header: Mapping[str, Any]) -> None:
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
            f"sweep name")


def save_plan(sweep_dir: Path, plan: Mapping[str, Any]) -> None:
    data = read_manifest(sweep_dir) or {}
    data["plan"] = dict(plan)
    atomic_write_json(sweep_dir / SWEEP_FILE, data)


class Manifest:
    """The in-memory sweep.json of one invocation; nothing is written when the record is refused."""

    def __init__(self, sweep_dir: Path, header: Mapping[str, Any]) -> None:
        self.sweep_dir = sweep_dir
        previous = read_manifest(sweep_dir) or {}
        if previous:
            check_sweep_settings(sweep_dir, previous, header)
            check_sweep_axes(sweep_dir, previous, header)
            check_sweep_values(sweep_dir, previous, header)
        now = utc_now()
        self.data: dict[str, Any] = {
            **header, "fingerprint": stable_hash(sweep_settings(header)), "created": previous.get("created", now),
            "updated": now, "state": RUNNING, "invocations": list(previous.get("invocations", [])),
            "warm_starts": list(previous.get("warm_starts", [])), "runs": list(previous.get("runs", [])),
            **({"plan": previous["plan"]} if "plan" in previous else {}),  # a seed plan (sweeps.seed_plan) stays
        }
        self._by_name = {entry["run"]: entry for entry in self.data["runs"]}
        self._invocation: dict[str, Any] = {}

    def previous(self, name: str) -> dict[str, Any] | None:
        return self._by_name.get(name)

    def entry(self, name: str, fields: Mapping[str, Any], warm_start: bool = False) -> dict[str, Any]:
        """The entry of run ``name`` (appended when new), updated with ``fields``."""
        section = self.data["warm_starts"] if warm_start else self.data["runs"]
        for entry in section:
            if entry["run"] == name:
                entry.update(fields)
                return entry
        entry = {"run": name, "state": PENDING, "exit_code": None, "start": None, "end": None, "wall_time_s": 0.0,
                 "attempts": 0, "launch": {}, "error": None, **fields}
        section.append(entry)
        if not warm_start:
            self._by_name[name] = entry
        return entry

    def begin_invocation(self, argv: Sequence[str]) -> None:
        self._invocation = {"argv": list(argv), "start": utc_now(), "end": None, "exit_code": None}
        self.data["invocations"].append(self._invocation)

    def end_invocation(self, exit_code: int) -> None:
        self.data["state"] = INTERRUPTED if exit_code > 128 else FAILED if exit_code else COMPLETED
        self._invocation.update(end=utc_now(), exit_code=exit_code)
        self.save()

    def save(self) -> None:
        self.data["updated"] = utc_now()
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.sweep_dir / SWEEP_FILE, self.data)
