"""Configs composed from ``conf/`` with Hydra's compose API, the one place that composes; Hydra's refusals become
:class:`ConfigError`. A config-group choice is a file or stored name, never a path."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl.overrides import Override, override_key, parse_override, unknown_override_message
from dataflex_rl.validation import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
VERSION_BASE = "1.3"
# The config group of named experiments: conf/experiment/<name>.yaml, each ``@package _global_`` (it may set any key).
EXPERIMENT_GROUP = "experiment"


def group_choices(group: str) -> list[str] | None:
    """The choices of config group ``group`` (YAML files and stored defaults), or None for no such group."""
    from dataflex_rl.run_config import store_defaults

    if not group or not group.isidentifier():  # a dotted key, a path, a package: not a group of conf/
        return None
    folder = Path(CONF_DIR) / group
    stored = store_defaults().get(group)
    if stored is None and not folder.is_dir():
        return None
    return sorted({*(stored or ()), *(path.stem for path in folder.glob("*.yaml"))})


def run_experiments() -> list[str]:
    return group_choices(EXPERIMENT_GROUP) or []


def check_group_choice(override: Override, allowed: Sequence[str] | None = None) -> None:
    """Refuse a group choice not in ``allowed``: Hydra reads it as a path (``experiment=../launcher/slurm``)."""
    group = override.key
    allowed = group_choices(group) if allowed is None else allowed
    if allowed is None:
        return
    article = "an" if group[:1] in "aeiou" else "a"
    choices = override.sweep if override.sweep is not None else (override.value,)
    for choice in choices:
        if choice is not None and choice != "null" and choice not in allowed:
            raise ConfigError(f"{group} = {choice!r} is not allowed: {article} {group} is the name of a file "
                              f"conf/{group}/<name>.yaml (a name, not a path); allowed: "
                              f"{', '.join(allowed) or '(none)'}")


def override_error(error: BaseException, overrides: Sequence[str], compose: Callable[[list[str]], Any]) -> ConfigError:
    unknown = unknown_override_message(error, list(overrides), compose)
    return ConfigError(unknown or f"bad override in {' '.join(overrides)}: {error}")


def compose_config(config_name: str, overrides: Sequence[str], config_dir: str | Path = CONF_DIR) -> Any:
    """``<config_dir>/<config_name>.yaml`` composed with ``overrides`` (a ``DictConfig``)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    with initialize_config_dir(config_dir=str(config_dir), version_base=VERSION_BASE):
        try:
            return compose(config_name=config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException, ValueError) as error:  # ValueError: a group set to null
            raise override_error(error, overrides,
                                 lambda others: compose(config_name=config_name, overrides=others)) from None


class TrainComposer:
    """``conf/train.yaml`` composed with many override lists, inside ``with TrainComposer() as compose:``."""

    def __enter__(self) -> TrainComposer:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from dataflex_rl.run_config import store_defaults

        store_defaults()
        self.hydra = initialize_config_dir(config_dir=CONF_DIR, version_base=VERSION_BASE)
        self.parser = OverridesParser.create()
        self.repository = GlobalHydra.instance().config_loader().repository
        self.bases: dict[tuple[str, ...], Any] = {}
        self.parsed: dict[str, Any] = {}
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.hydra.__exit__(*exc_info)

    def _parse(self, text: str) -> Any:
        if text not in self.parsed:  # the common overrides recur in every run
            self.parsed[text] = self.parser.parse_overrides([text])[0]
        return self.parsed[text]

    def _is_value(self, override: Any) -> bool:
        if override.is_sweep_override() or override.is_hydra_override():
            return False
        return isinstance(override.value(), dict) or not self.repository.group_exists(override.key_or_group)

    def __call__(self, overrides: Sequence[str]) -> dict[str, Any]:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        from dataflex_rl.dataflex_block import with_param_defaults

        overrides = list(overrides)
        for text in overrides:
            if group_choices(override_key(text)) is not None:
                check_group_choice(parse_override(text))
        try:
            parsed = [self._parse(text) for text in overrides]
            if any(override.is_hydra_override() for override in parsed):  # a search path adds groups: compose all
                values, groups = [], tuple(overrides)
            else:
                values = [override for override in parsed if self._is_value(override)]
                groups = tuple(override.input_line for override in parsed if not self._is_value(override))
            if groups not in self.bases:
                self.bases[groups] = self._compose(groups)
            config = copy.deepcopy(self.bases[groups])
            ConfigLoaderImpl._apply_overrides_to_config(values, config)
            resolved = OmegaConf.to_container(config, resolve=True)
            resolved["dataflex"] = with_param_defaults(resolved.get("dataflex"))
            return resolved
        except (HydraException, OmegaConfBaseException, ValueError) as error:
            raise override_error(error, overrides, self._compose) from None

    @staticmethod
    def _compose(overrides: Sequence[str]) -> Any:
        """The groups composed, the ``dataflex`` block's params completed so that an override can set any of them."""
        from hydra import compose
        from omegaconf import OmegaConf, open_dict

        from dataflex_rl.dataflex_block import with_param_defaults

        config = compose(config_name="train", overrides=list(overrides))
        with open_dict(config):
            config.dataflex = with_param_defaults(OmegaConf.to_container(config.dataflex))
        return config


def compose_train_config(overrides: Sequence[str]) -> dict[str, Any]:
    """``conf/train.yaml`` composed with ``overrides`` and resolved: a run's config, as the run store records it."""
    with TrainComposer() as compose:
        return compose(overrides)
