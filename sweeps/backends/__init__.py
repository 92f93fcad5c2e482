"""Backends as the sweep driver sees them: ``backend=<name>`` is the :class:`Backend` subclass that
``conf/backend/<name>.yaml`` names (``_target_``), living in the backend's own package. The config, the driver and
the Optuna search call its methods and never test a backend's name."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from dataflex_rl.overrides import Override
from dataflex_rl.validation import ConfigError, check_choice, defaults_of

# The modules of these types import this one.
SweepConfig = RunSpec = PlannedRun = Any

BACKEND_CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "backend"


class Backend:
    """How a sweep runs on one backend. Subclasses declare :attr:`steps_key` and implement :meth:`plan`."""

    # The dataclass of the sweep's ``<backend>:`` block (``verl.experiment=...``), whose defaults are the only
    # ones; None: the backend has no settings of its own.
    settings: ClassVar[type | None] = None
    steps_key: str = ""  # the run config key that sets a run's RL steps (``steps=N`` writes it)
    sets_threads: bool = True  # False: the backend manages its own threads, so the driver passes no thread count
    # True: a completed run's folder may hold no run store (only the backend's own files); sweep.json then decides.
    run_store_optional: bool = False

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self, config: SweepConfig) -> None:
        """Refuse sweep settings this backend cannot honour (:class:`ConfigError` naming key and value)."""

    def check_extra(self, override: Override) -> None:
        """Refuse an ``extra`` override this backend's runs cannot take."""

    def check_metric(self, key: str, value: Any) -> str:
        """``value`` if it names a metric this backend's runs log (``plan_metric``, the study's ``metric``)."""
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key} = {value!r} is not allowed: it must be the name of a logged metric")
        return value

    def default_steps(self, config: SweepConfig) -> int | None:
        """The RL steps of each run when ``steps`` is unset (None: the run config's own)."""
        return None

    def plan(self, config: SweepConfig, specs: Sequence[RunSpec], sweep: str, sweep_dir: Path,
             threads: int | None) -> list[PlannedRun]:
        """Every run's command, environment, run folder and log, validated (the first bad run refuses all)."""
        raise NotImplementedError

    def warm_starts(self, config: SweepConfig, specs: Sequence[RunSpec], sweep_dir: Path,
                    threads: int | None) -> list[PlannedRun]:
        """Shared warm starts to run before the runs."""
        return []

    def check_machine(self, config: SweepConfig) -> None:
        """Refuse a sweep this machine cannot run (before planning the runs)."""

    def jobs_here(self, config: SweepConfig) -> tuple[int, str] | None:
        """``(runs at once, why)`` when this machine fits fewer runs than cores; None: the driver's rule."""
        return None

    def common_config(self, config: SweepConfig) -> dict | None:
        """The resolved settings every run shares, that a rerun is compared on (None: overrides)."""
        return None

    def estimate_seconds(self, config: SweepConfig, runs: int, jobs: int) -> tuple[float, str, str] | None:
        """``(wall seconds of runs of config, jobs at once, on an idle machine; what a run is; what the estimate
        assumes)``; None: no estimate for this backend."""
        return None

    def starting_lr(self) -> float:
        """The learning rate a search over ``trainer.lr`` starts from (the run config's default)."""
        raise ConfigError(f"backend={self.name} has no learning rate to search from; search lr on backend=local")

    def recorded_settings(self, config: SweepConfig) -> dict | None:
        """This backend's own settings that fix the runs' numbers (``sweep.json``'s ``backend_settings``, compared
        on a rerun like the steps); None: none beyond what the runs' overrides say."""
        return None


def backend_names() -> list[str]:
    return sorted(path.stem for path in BACKEND_CONF_DIR.glob("*.yaml"))


def backend_settings_blocks() -> tuple[str, ...]:
    return tuple(name for name in backend_names() if get_backend(name).settings is not None)


def store_backend_options() -> None:
    """``backend=<name>`` as a group of the sweep config: it sets ``backend`` and adds the backend's settings block
    with their defaults. Stored on first use, as a backend's module imports the sweep config's."""
    from hydra.core.config_store import ConfigStore

    for name in backend_names():
        settings = get_backend(name).settings
        node = {"backend": name, **({name: defaults_of(settings)} if settings is not None else {})}
        ConfigStore.instance().store(group="backend", name=name, node=node, package="_global_")


@functools.cache
def get_backend(name: str) -> Backend:
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    check_choice("backend", name, tuple(backend_names()))
    return get_class(OmegaConf.load(BACKEND_CONF_DIR / f"{name}.yaml")["_target_"])(name)

