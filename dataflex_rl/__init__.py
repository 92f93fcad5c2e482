"""dataflex-rl: experiment sweeps and ablations for token-level advantage reweighting in RL for LLMs. The public
names below are imported lazily (PEP 562), so ``import dataflex_rl.keys`` or ``dataflex_rl.tasks`` loads no torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {"ACTUATORS": "dataflex_rl.actuators",
            "ConfigError": "dataflex_rl.validation", "DataflexConfig": "dataflex_rl.dataflex_block",
            "Mechanism": "dataflex_rl.mechanism", "MechanismOutput": "dataflex_rl.mechanism",
            "SCORERS": "dataflex_rl.scorers", "build_mechanism": "dataflex_rl.dataflex_block",
            "parse_dataflex_config": "dataflex_rl.dataflex_block"}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from dataflex_rl.actuators import ACTUATORS
    from dataflex_rl.dataflex_block import DataflexConfig, build_mechanism, parse_dataflex_config
    from dataflex_rl.mechanism import Mechanism, MechanismOutput
    from dataflex_rl.scorers import SCORERS
    from dataflex_rl.validation import ConfigError


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dataflex_rl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
