"""The ``logger`` config group and build_loggers."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dataflex_rl.compose import compose_train_config
from dataflex_rl.tracking import (
    ConsoleLogger,
    LoggerConfig,
    RunIdentity,
    RunStore,
    WandbConfig,
    build_loggers,
    parse_logger_config,
)
from dataflex_rl.validation import ConfigError


def composed_logger_group(overrides=()):
    """The ``logger`` group as ``conf/train.yaml`` composes it (its defaults list pulls in conf/logger/wandb/)."""
    return compose_train_config(list(overrides))["logger"]


def test_default_yaml_matches_the_dataclass_defaults():
    parsed = parse_logger_config(composed_logger_group())
    assert parsed == LoggerConfig() == parse_logger_config(None)
    assert parsed == LoggerConfig(
        hist_every=10, console_every=10,
        loggers={"wandb": WandbConfig(mode="offline", project="dataflex-rl", entity=None, tags=())}
    )


def test_overrides_are_read():
    parsed = parse_logger_config(
        {"hist_every": 0, "console_every": 1, "wandb": {"mode": "online", "entity": "team", "tags": ["ablation"]}}
    )
    assert (parsed.hist_every, parsed.console_every) == (0, 1)
    assert parsed.wandb == WandbConfig(mode="online", project="dataflex-rl", entity="team", tags=("ablation",))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"wandb": {"mode": "cloud"}},
            "logger.wandb.mode = 'cloud' is not allowed; allowed values: 'offline', 'online', 'disabled'",
        ),
        ({"hist_every": -1}, "logger.hist_every = -1 is not allowed"),
        ({"console_every": 0}, "logger.console_every = 0 is not allowed: it must be an integer >= 1"),
        ({"hist_evry": 5}, "logger: unknown key\\(s\\) 'hist_evry'; allowed keys: hist_every, console_every, wandb"),
        ({"wandb": {"mod": "offline"}}, "logger.wandb: unknown key\\(s\\) 'mod'"),
        ({"wandb": {"project": ""}}, "logger.wandb.project = '' is not allowed"),
        ({"wandb": {"tags": "one"}}, "logger.wandb.tags = 'one' is not allowed"),
        ({"wandb": {"tags": ["x" * 65]}}, "tags are strings of 1 to 64 characters"),
        ({"wandb": "offline"}, "logger.wandb = 'offline' is not allowed"),
    ],
)
def test_bad_values_name_the_key(config, message):
    with pytest.raises(ConfigError, match=message):
        parse_logger_config(config)
    assert issubclass(ConfigError, ValueError)


def test_build_loggers_order_and_settings(tmp_path):
    identity = RunIdentity(
        sweep="s", run="r", backend="local", mechanism="reweight", alpha=0.0, seed=0, config_hash="0" * 12
    )
    store = RunStore(tmp_path)
    loggers = build_loggers(
        OmegaConf.create({"hist_every": 4, "console_every": 2, "wandb": {"mode": "disabled"}}), store, identity, {}
    )
    assert [type(logger) for logger in loggers.loggers] == [RunStore, ConsoleLogger]
    assert loggers.loggers[0] is store and loggers.loggers[1].every == 2
    assert loggers.hist_every == 4
    # The run store is critical: its errors stop the run instead of being swallowed.
    with pytest.raises(ValueError, match="step = -1"):
        loggers.log_metrics(-1, {"a": 1.0})
    loggers.close()
