"""Who a run is (:class:`RunIdentity`) and the labels built from it (run folder names, W&B names and job types);
what ``meta.json`` and W&B record: docs/run_store.md."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
import pathlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.hashing import stable_hash
from dataflex_rl.keys import ALPHA_KEY, ETA_KEY
from dataflex_rl.overrides import override_key
from dataflex_rl.validation import to_plain

# Short factor names of the axes every ablation uses; any other axis is named by its config key (``trainer.lr``).
AXIS_NAMES = {ALPHA_KEY: "alpha", ETA_KEY: "eta"}
SEED_AXIS = "seed"
# Factor names shown by a short label in run names and W&B job types (the others by their key's last part).
SHORT_LABELS = {"alpha": "a", "seed": "s"}
_AXIS_VALUE_TYPES = (str, int, float, bool, type(None))
_NUMERIC_TEXT = re.compile(r"[-+]?(\d|\.\d)")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_WANDB_TEXT_LIMIT = 64


def warm_start_record(design: str | None, checkpoint: str | None, sft_seed: int | None = None,
                      outcome: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """meta.json's ``warm_start``: the design, the checkpoint, its SFT seed and what its training did (``outcome``:
    ``steps``, and under a stopping rule ``target_accuracy``, ``check_accuracy``, ``reached``)."""
    return {"design": design, "checkpoint": checkpoint, "sft_seed": sft_seed, **(outcome or {})}


def config_hash(config: Mapping[str, Any]) -> str:
    return stable_hash(config, 12)


def git_commit(path: str | pathlib.Path | None = None) -> str | None:
    """Full commit hash of the git checkout holding ``path`` (default: the sources), or None; never raises."""
    where = pathlib.Path(path) if path is not None else pathlib.Path(__file__).resolve().parent.parent
    try:
        result = subprocess.run(["git", "-C", str(where), "rev-parse", "--verify", "--quiet", "HEAD"],
                                capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    return commit if result.returncode == 0 and len(commit) >= 40 else None


def axis_name(key: str) -> str:
    """Factor name of a swept config key: :data:`AXIS_NAMES`' short name, else the bare key."""
    bare = override_key(key)
    return AXIS_NAMES.get(bare, bare)


def axis_values(config: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``{axis_name(key): value of the dotted key in config}`` (None where the config lacks it)."""
    plain = to_plain(config)
    values: dict[str, Any] = {}
    for key in keys:
        node: Any = plain
        for part in override_key(key).split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        values[axis_name(key)] = node if isinstance(node, _AXIS_VALUE_TYPES) else json.dumps(node, default=str)
    return values


def factor_labels(names: Sequence[str]) -> dict[str, str]:
    last_parts = [name.split(".")[-1] for name in names]
    return {name: SHORT_LABELS.get(name) or (last if last_parts.count(last) == 1 else name)
            for name, last in zip(names, last_parts, strict=True)}


def run_label(factors: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    labels = labels or factor_labels(list(factors))
    parts = []
    for name, value in factors.items():
        # the shortest round-tripping number; + 0.0 turns -0.0 into 0.0, the same arm
        text = repr(float(value) + 0.0) if isinstance(value, float) else str(value)
        if name != "mechanism_label":
            text = f"{labels[name]}{text}" if _NUMERIC_TEXT.match(text) else f"{labels[name]}-{text}"
        parts.append(_UNSAFE.sub("_", text).strip("_") or "_")
    return "-".join(parts)


def job_type_of(factors: Mapping[str, Any]) -> str | None:
    """W&B job_type of a run's non-seed ``factors`` (``a0.5-lr0.0003``)."""
    if not factors:
        return None
    text = run_label(factors)
    if len(text) > _WANDB_TEXT_LIMIT:
        text = text[:55] + "-" + stable_hash(text, 8)
    return text


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """The identity of one run, written to ``meta.json`` and naming the W&B run."""

    sweep: str
    run: str
    backend: str
    mechanism: str
    alpha: float
    seed: int
    config_hash: str
    git_commit: str | None = None
    axes: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        def refuse(name: str, must: str) -> None:
            raise ValueError(f"RunIdentity.{name} = {getattr(self, name)!r} is not allowed: it must {must}")

        for name in ("sweep", "run", "backend", "mechanism", "config_hash"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                refuse(name, "be a non-empty string")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or not math.isfinite(self.alpha):
            refuse("alpha", "be a finite number")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            refuse("seed", "be an integer")
        if self.git_commit is not None and not isinstance(self.git_commit, str):
            refuse("git_commit", "be a str or None")
        if not isinstance(self.axes, Mapping) or not all(isinstance(name, str) and name and isinstance(
                value, _AXIS_VALUE_TYPES) for name, value in self.axes.items()):
            refuse("axes", "map factor names to str, int, float, bool or None")
        # Plain types (not numpy scalars) so JSON and names are stable.
        for name, plain in (("axes", dict), ("alpha", float), ("seed", int)):
            object.__setattr__(self, name, plain(getattr(self, name)))

    @classmethod
    def for_config(cls, config: Mapping[str, Any], *, sweep: str, run: str, backend: str, mechanism: str,
                   alpha: float, seed: int, axis_keys: Sequence[str] = ()) -> RunIdentity:
        """The identity with ``config_hash``, ``git_commit`` and the ``axes`` read from ``config`` at ``axis_keys``."""
        return cls(sweep=sweep, run=run, backend=backend, mechanism=mechanism, alpha=alpha, seed=seed,
                   config_hash=config_hash(config), git_commit=git_commit(), axes=axis_values(config, axis_keys))

    @property
    def factors(self) -> dict[str, Any]:
        """The axes without the seed: what makes this run a variant rather than a repetition."""
        return {name: value for name, value in self.axes.items() if name != SEED_AXIS}

    @property
    def wandb_name(self) -> str:
        """The run folder's name in a grid (W&B and the run store show the same name)."""
        return self.run if self.axes else f"{self.sweep}-a{self.alpha:g}-s{self.seed}"

    @property
    def job_type(self) -> str | None:
        """W&B job_type: the non-seed factors, so "Group + Job Type" gives one curve per variant."""
        return job_type_of(self.factors)

    @property
    def tags(self) -> tuple[str, str]:
        return (self.mechanism, self.backend)

    def to_dict(self) -> dict[str, Any]:
        """The fields as ``meta.json`` records them; ``axes`` only for a run of a grid."""
        return {name: value for name, value in dataclasses.asdict(self).items() if name != "axes" or value}


# Two numeric factor values are one arm when they agree within a relative 1e-5 (an absolute 1e-8 near 0): every table
# prints 6 significant digits, so two distinct arms never share a label (the driver refuses values this rule cannot
# tell apart; the analysis selects groups and the baseline by it).
SAME_ARM_RELATIVE = 1e-5
SAME_ARM_ABSOLUTE = 1e-8


def as_number(value: Any) -> float | None:
    """A factor value as a float when it is a number or a number's text (``'3e-05'``), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    with contextlib.suppress(ValueError):
        return float(value) if isinstance(value, str) and _NUMERIC_TEXT.match(value) else None
    return None


def same_arm(first: Any, second: Any) -> bool:
    """Whether two factor values are one arm: numbers within :data:`SAME_ARM_RELATIVE` (or :data:`SAME_ARM_ABSOLUTE`),
    anything else by equality (``-0.0`` is ``0.0``; ``'3e-05'`` is ``3e-05``)."""
    a, b = as_number(first), as_number(second)
    if a is None or b is None:
        return first == second and type(first) is type(second)
    return math.isclose(a, b, rel_tol=SAME_ARM_RELATIVE, abs_tol=SAME_ARM_ABSOLUTE)


def same_arm_mask(values: Any, wanted: float) -> Any:
    """:func:`same_arm` of each number of ``values`` (an array) against ``wanted`` (NaN matches nothing)."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    scale = np.maximum(np.abs(values), abs(wanted))
    return np.abs(values - wanted) <= np.maximum(SAME_ARM_RELATIVE * scale, SAME_ARM_ABSOLUTE)


def check_distinct_arms(name: str, values: Sequence[Any]) -> None:
    """Refuse two values of one axis that :func:`same_arm` cannot tell apart but that are not equal."""
    for index, value in enumerate(values):
        for other in values[:index]:
            if same_arm(value, other):
                raise ValueError(
                    f"{name} = {value!r} is not allowed beside {other!r}: two values within a relative "
                    f"{SAME_ARM_RELATIVE:g} (or {SAME_ARM_ABSOLUTE:g} of each other near 0) are one arm, the "
                    f"precision of every table and run name; give values that differ more, or one of them")
