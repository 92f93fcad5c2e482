"""Who a run is: sweep, run name, backend, mechanism, alpha, seed, config hash and source commit.

The same identity names the run folder's ``meta.json``, the W&B run (group = sweep, name = ``<sweep>-a<alpha>-s<seed>``,
tags = mechanism and backend) and the analysis table's ``sweep``/``run``/``alpha``/``seed`` columns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import pathlib
import subprocess
from collections.abc import Mapping
from typing import Any

from dataflex_rl.config import to_plain

CONFIG_HASH_LENGTH = 12
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


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """The identity of one run, written to ``meta.json`` and used to name the W&B run.

    ``run`` is the run folder's name inside the sweep folder; ``alpha`` is the mechanism's mixing coefficient
    (``w_t = alpha * pi(t) + (1 - alpha)``; 0 is the baseline).
    """

    sweep: str
    run: str
    backend: str
    mechanism: str
    alpha: float
    seed: int
    config_hash: str
    git_commit: str | None = None

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
    ) -> RunIdentity:
        """Identity with ``config_hash`` computed from ``config`` and ``git_commit`` from the source checkout."""
        return cls(
            sweep=sweep,
            run=run,
            backend=backend,
            mechanism=mechanism,
            alpha=alpha,
            seed=seed,
            config_hash=config_hash(config),
            git_commit=git_commit(),
        )

    @property
    def wandb_name(self) -> str:
        """``<sweep>-a<alpha>-s<seed>`` with alpha in shortest form (``0``, ``0.25``, ``1``)."""
        return f"{self.sweep}-a{self.alpha:g}-s{self.seed}"

    @property
    def tags(self) -> tuple[str, str]:
        """(mechanism, backend): the W&B tags every run carries."""
        return (self.mechanism, self.backend)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (the identity part of ``meta.json``)."""
        return dataclasses.asdict(self)
