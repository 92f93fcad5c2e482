"""Optional loggers come from the LOGGERS registry, one YAML each: a new one needs no edit of tracking/build.py."""

from __future__ import annotations

import dataclasses
import logging
import pathlib

import pytest
from omegaconf import OmegaConf

from dataflex_rl.compose import compose_train_config
from dataflex_rl.tracking import (LOGGERS, ConsoleLogger, RunStore, WandbConfig, build_loggers, parse_logger_config,
                                  run_store)
from dataflex_rl.tracking.build import in_tree_loggers, logger_class
from dataflex_rl.validation import ConfigError
from tests import registry_snapshot
from tests.tracking.identities import make_identity


@dataclasses.dataclass(frozen=True)
class ThrowawayConfig:
    """``logger.throwaway``: two keys, one checked."""

    every: int = 1
    prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"logger.throwaway.every = {self.every!r} is not allowed: it must be an integer >= 1")


class ThrowawayLogger:
    """Keeps what it receives (every ``every``-th step), so the test can read it."""

    name = "throwaway"
    Config = ThrowawayConfig
    built: list[ThrowawayLogger] = []

    def __init__(self, config: ThrowawayConfig, run_dir: pathlib.Path, run: str) -> None:
        self.config, self.run_dir, self.run = config, run_dir, run
        self.metrics: list[tuple[int, dict]] = []
        self.closed: str | None = None

    @classmethod
    def from_config(cls, config, *, run_dir, identity, resolved_config):
        logger = cls(config, pathlib.Path(run_dir), identity.run)
        cls.built.append(logger)
        return logger

    def log_config(self, config: dict) -> None:
        """Nothing to keep."""

    def log_metrics(self, step: int, metrics) -> None:
        if step % self.config.every == 0:
            self.metrics.append((step, {f"{self.config.prefix}{key}": value for key, value in metrics.items()}))

    def log_histogram(self, step: int, name: str, edges, counts) -> None:
        """Not kept."""

    def close(self, state: str = "completed") -> None:
        self.closed = state


@pytest.fixture
def throwaway_registered():
    """``throwaway`` registered for one test only (the registry is restored afterwards)."""
    with registry_snapshot(LOGGERS):
        LOGGERS.register("throwaway")(ThrowawayLogger)
        ThrowawayLogger.built.clear()
        yield ThrowawayLogger
    assert "throwaway" not in LOGGERS


@pytest.fixture
def throwaway_conf(tmp_path) -> pathlib.Path:
    """A config folder holding only the new logger's YAML, added to Hydra's search path."""
    folder = tmp_path / "extra_conf" / "logger" / "throwaway"
    folder.mkdir(parents=True)
    (folder / "default.yaml").write_text("every: 2\nprefix: 'tw/'\n")
    return tmp_path / "extra_conf"


def compose_logger(overrides: list[str]):
    return OmegaConf.create(compose_train_config(overrides)["logger"])


def test_a_registered_logger_and_its_yaml_receive_the_metrics(tmp_path, throwaway_registered, throwaway_conf):
    logger_cfg = compose_logger([f"hydra.searchpath=[file://{throwaway_conf}]", "+logger/throwaway=default",
                                 "logger.wandb.mode=disabled"])
    assert OmegaConf.to_container(logger_cfg.throwaway) == {"every": 2, "prefix": "tw/"}
    store = RunStore(tmp_path / "run")
    with build_loggers(logger_cfg, store, make_identity(run="a0.5-s1"), {}) as loggers:
        assert [type(logger) for logger in loggers.loggers] == [RunStore, ThrowawayLogger, ConsoleLogger]
        for step in range(5):
            loggers.log_metrics(step, {"score": step / 10})
    (built,) = throwaway_registered.built
    assert built.metrics == [(0, {"tw/score": 0.0}), (2, {"tw/score": 0.2}), (4, {"tw/score": 0.4})]
    assert (built.closed, built.run, built.run_dir) == ("completed", "a0.5-s1", tmp_path / "run")


def test_a_new_loggers_settings_are_checked_by_its_config(throwaway_registered):
    assert parse_logger_config({"throwaway": None}).throwaway == ThrowawayConfig()
    with pytest.raises(ConfigError, match="logger.throwaway.every = 0 is not allowed"):
        parse_logger_config({"throwaway": {"every": 0}})
    with pytest.raises(ConfigError, match=r"logger.throwaway: unknown key\(s\) 'evry'; allowed keys: every, prefix"):
        parse_logger_config({"throwaway": {"evry": 3}})


def test_an_unknown_logger_name_lists_the_registered_ones():
    with pytest.raises(ConfigError, match=r"logger: unknown key\(s\) 'tensorbord'; allowed keys: "
                                          r"hist_every, console_every, wandb"):
        parse_logger_config({"tensorbord": {}})


def test_a_logger_without_its_block_does_not_run(tmp_path):
    parsed = parse_logger_config(compose_logger(["~logger/wandb"]))
    assert parsed.loggers == {} and (parsed.hist_every, parsed.console_every) == (10, 10)
    loggers = build_loggers(parsed, RunStore(tmp_path), make_identity(), {})
    assert [type(logger) for logger in loggers.loggers] == [RunStore, ConsoleLogger]
    loggers.close()
    # None still means the project's defaults, as the default YAML composes them.
    assert parse_logger_config(None).loggers == {"wandb": WandbConfig()}


def test_a_logger_that_cannot_start_is_left_out_with_a_warning(tmp_path, throwaway_registered, caplog):
    def failing(cls, config, **context):
        raise OSError("no space left")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ThrowawayLogger, "from_config", classmethod(failing))
        with caplog.at_level(logging.WARNING):
            loggers = build_loggers({"throwaway": {}}, RunStore(tmp_path), make_identity(), {})
    assert [type(logger) for logger in loggers.loggers] == [RunStore, ConsoleLogger]
    assert "logger throwaway cannot start (OSError: no space left)" in caplog.text
    loggers.log_metrics(0, {"a": 1.0})
    loggers.close()
    assert run_store.read_status(RunStore(tmp_path).run_dir)["state"] == "completed"


@pytest.mark.parametrize("name", in_tree_loggers())
def test_every_in_tree_logger_has_a_registered_class_that_accepts_its_composed_block(name):
    cls = logger_class(name)
    assert cls.name == name
    block = compose_train_config([f"+logger/{name}=default"] if name != "wandb" else [])["logger"][name]
    assert parse_logger_config({name: block}).loggers[name] == cls.Config()
