"""dataflex-rl: experiment sweeps and ablations for token-level advantage reweighting in RL for LLMs."""

from dataflex_rl.config import ConfigError, DataflexConfig, parse_dataflex_config
from dataflex_rl.mechanism import MECHANISMS, Mechanism, MechanismOutput, build_mechanism, register_mechanism
from dataflex_rl.actuators import ACTUATORS, register_actuator
from dataflex_rl.scorers import SCORERS, register_scorer

__all__ = [
    "ACTUATORS",
    "MECHANISMS",
    "SCORERS",
    "ConfigError",
    "DataflexConfig",
    "Mechanism",
    "MechanismOutput",
    "build_mechanism",
    "parse_dataflex_config",
    "register_actuator",
    "register_mechanism",
    "register_scorer",
]
__version__ = "0.1.0"
