"""Who a run is: sweep, run name, backend, mechanism, alpha, seed, the sweep's axis values, config hash and commit.

The same identity names the run folder's ``meta.json``, the W&B run (group = sweep, name = the run folder's name when
the run belongs to a grid, else ``<sweep>-a<alpha>-s<seed>``; job_type = the run's non-seed factors; tags = mechanism
and backend) and the analysis table's ``sweep``/``run``/``alpha``/``seed`` and factor columns.

A sweep's grid is a list of axes (config keys the sweep varies); a run records ``axes = {factor name: value}``, the
value read from the run's own resolved config. Factor names are the config keys, except the short names of
:data:`AXIS_NAMES` (``alpha``, ``eta``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import pathlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.keys import ALPHA_KEY, ETA_KEY
from dataflex_rl.validation import to_plain

CONFIG_HASH_LENGTH = 12
def warm_start_record(design: str | None, checkpoint: str | None, sft_seed: int | None = None) -> dict[str, Any]:
    """``meta.json``'s ``warm_start``: the sweep's design (``per_seed`` | ``shared``; None outside a sweep), the
    checkpoint the run started from (the SFT cache folder, or the model path a verl run loads; its identity: runs
    with the same one share a warm start) and the SFT seed that drew it, where known."""
    return {"design": design, "checkpoint": checkpoint, "sft_seed": sft_seed}


# Short factor names of the axes every ablation uses; any other axis is named by its config key (``trainer.lr``).
AXIS_NAMES = {ALPHA_KEY: "alpha", ETA_KEY: "eta"}
SEED_AXIS = "seed"
_AXIS_VALUE_TYPES = (str, int, float, bool, type(None))
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent


def _canonical_default(value: Any) -> Any:
    """JSON fallback for the few non-JSON values a resolved config may hold (paths)."""
    if isinstance(value, pathlib.PurePath):
        return str(value)
    raise TypeError(f"config value {value!r} of type {type(value).__name__} cannot be hashed: use plain YAML types")


def config_hash(config: Mapping[str, Any]) -> str:
    """First 12 hex digits of sha256 over the canonical JSON of ``config`` (keys sorted, no spaces).

    Key order and ``DictConfig`` vs dict do not change the hash; any value change does.
    """
    plain = to_plain(config)
    if not isinstance(plain, Mapping):
        raise TypeError(f"config must be a mapping, got {type(config).__name__}")
    canonical = json.dumps(
        plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True, default=_canonical_default
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:CONFIG_HASH_LENGTH]


def git_commit(path: str | pathlib.Path | None = None) -> str | None:
    """Full commit hash of the git checkout holding ``path`` (default: the dataflex_rl sources), else None.

    None when git is missing, ``path`` is not inside a work tree, the repository has no commit yet, or git hangs.
    Never raises.
    """
    where = pathlib.Path(path) if path is not None else _PACKAGE_DIR
    try:
        result = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--verify", "--quiet", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    if result.returncode != 0 or len(commit) < 40:
        return None
    return commit


def axis_name(key: str) -> str:
    """Factor name of a swept config key: :data:`AXIS_NAMES`' short name, else the key without a ``+``/``~`` prefix."""
    bare = key.lstrip("+~")
    return AXIS_NAMES.get(bare, bare)


def axis_values(config: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``{axis_name(key): value of the dotted key in config}`` (None where the config lacks the key).

    The values come from the run's resolved config, so the factor columns always match the config beside them.
    """
    plain = to_plain(config)
    values: dict[str, Any] = {}
    for key in keys:
        node: Any = plain
        for part in key.lstrip("+~").split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        values[axis_name(key)] = node if isinstance(node, _AXIS_VALUE_TYPES) else json.dumps(node, default=str)
    return values


# Factor names shown by a short label in run names and W&B job types (the others by their key's last part).
SHORT_LABELS = {"alpha": "a", "seed": "s"}
_NUMERIC_TEXT = re.compile(r"[-+]?(\d|\.\d)")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def format_number(value: float) -> str:
    """Shortest round-tripping text of a number (``0.25``, ``0.0``, ``1e-05``): overrides, run names, job types."""
    return repr(float(value))


def factor_labels(names: Sequence[str]) -> dict[str, str]:
    """The label of each factor in a run's label: :data:`SHORT_LABELS`, else the key's last part, or the whole key
    where two factors share a last part (``trainer.lr`` -> ``lr``)."""
    last_parts = [name.split(".")[-1] for name in names]
    return {name: SHORT_LABELS.get(name) or (last if last_parts.count(last) == 1 else name)
            for name, last in zip(names, last_parts, strict=True)}


def factor_tag(label: str, value: Any, *, alone: bool = False) -> str:
    """One factor in a run's label (folder names, W&B job types): ``a0.5``, ``s1``, ``lr0.0003``,
    ``task-knights_knaves``; ``alone``: the value without its label (a mechanism preset: ``ar``)."""
    text = format_number(value) if isinstance(value, float) else str(value)
    if alone:
        return text
    return f"{label}{text}" if _NUMERIC_TEXT.match(text) else f"{label}-{text}"


def safe_name(text: str) -> str:
    """``text`` with every run of characters outside ``[A-Za-z0-9._-]`` made one ``_`` (a folder name part)."""
    return _UNSAFE.sub("_", text).strip("_") or "_"


def run_label(factors: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> str:
    """A run's factors as one label, in the given order: ``{"alpha": 0.5, "seed": 1, "mechanism_label": "ar"}`` ->
    ``a0.5-s1-ar`` (the preset label stands alone; each part made safe for a folder name). ``labels``: the
    :func:`factor_labels` of the whole grid, so every run of a sweep labels a factor alike. The one builder of sweep
    run folder names and W&B job types."""
    labels = labels or factor_labels(list(factors))
    return "-".join(safe_name(factor_tag(labels[name], value, alone=name == "mechanism_label"))
                    for name, value in factors.items())


def job_type_of(factors: Mapping[str, Any]) -> str | None:
    """W&B job_type of a run's non-seed ``factors`` (``{"alpha": 0.5, "trainer.lr": 3e-4}`` -> ``a0.5-lr0.0003``);
    None for none. Longer than W&B's 64 characters, the tail is replaced by a hash of the whole."""
    if not factors:
        return None
    text = run_label(factors)
    if len(text) > 64:
        text = text[:55] + "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return text


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """The identity of one run, written to ``meta.json`` and used to name the W&B run.

    ``run`` is the run folder's name inside the sweep folder; ``alpha`` is the mechanism's mixing coefficient
    (``w_t = alpha * pi(t) + (1 - alpha)``; 0 is the baseline). ``axes``: ``{factor name: value}`` of every axis of
    the sweep's grid (seed included; empty for a run outside a grid).
    """

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
        for name in ("sweep", "run", "backend", "mechanism", "config_hash"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"RunIdentity.{name} = {value!r} is not allowed: it must be a non-empty string")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real) or not math.isfinite(self.alpha):
            raise ValueError(f"RunIdentity.alpha = {self.alpha!r} is not allowed: it must be a finite number")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"RunIdentity.seed = {self.seed!r} is not allowed: it must be an integer")
        if self.git_commit is not None and not isinstance(self.git_commit, str):
            raise ValueError(f"RunIdentity.git_commit = {self.git_commit!r} is not allowed: it must be a str or None")
        if not isinstance(self.axes, Mapping) or not all(
                isinstance(name, str) and name and isinstance(value, _AXIS_VALUE_TYPES)
                for name, value in self.axes.items()):
            raise ValueError(f"RunIdentity.axes = {self.axes!r} is not allowed: it must map factor names to "
                             f"str, int, float, bool or None")
        object.__setattr__(self, "axes", dict(self.axes))
        # Normalise numeric types (numpy scalars, ints for alpha) so JSON and names are stable.
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "seed", int(self.seed))

    @classmethod
    def for_config(
        cls,
        config: Mapping[str, Any],
        *,
        sweep: str,
        run: str,
        backend: str,
        mechanism: str,
        alpha: float,
        seed: int,
        axis_keys: Sequence[str] = (),
    ) -> RunIdentity:
        """Identity with ``config_hash`` computed from ``config``, ``git_commit`` from the source checkout and
        ``axes`` read from ``config`` at the swept ``axis_keys``."""
        return cls(
            sweep=sweep,
            run=run,
            backend=backend,
            mechanism=mechanism,
            alpha=alpha,
            seed=seed,
            config_hash=config_hash(config),
            git_commit=git_commit(),
            axes=axis_values(config, axis_keys),
        )

    @property
    def factors(self) -> dict[str, Any]:
        """The axes without the seed: what makes this run a variant rather than a repetition."""
        return {name: value for name, value in self.axes.items() if name != SEED_AXIS}

    @property
    def wandb_name(self) -> str:
        """The run folder's name for a run of a grid (the sweep builds it from the axes, so W&B and the run store
        show the same name); else ``<sweep>-a<alpha>-s<seed>`` with alpha in shortest form (``0``, ``0.25``, ``1``)."""
        if self.axes:
            return self.run
        return f"{self.sweep}-a{self.alpha:g}-s{self.seed}"

    @property
    def job_type(self) -> str | None:
        """W&B job_type: the non-seed factors (``a0.5-lr0.0003``), so "Group + Job Type" gives one curve per variant;
        None outside a grid (:func:`job_type_of`)."""
        return job_type_of(self.factors)

    @property
    def tags(self) -> tuple[str, str]:
        """(mechanism, backend): the W&B tags every run carries."""
        return (self.mechanism, self.backend)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (the identity part of ``meta.json``); ``axes`` only for a run of a grid."""
        fields = dataclasses.asdict(self)
        if not fields["axes"]:
            del fields["axes"]
        return fields
