import pytest

from dataflex_rl import ACTUATORS, SCORERS, build_mechanism
from dataflex_rl.registry import Registry, RegistryError
from dataflex_rl.scorers import TokenProbScorer
from tests import registry_snapshot


class Widget:
    pass


class Gadget:
    pass


def test_duplicate_name_raises_and_names_the_holder():
    registry = Registry("widget")
    registry.register("a")(Widget)
    with pytest.raises(RegistryError, match=r"widget 'a' is already registered \(by tests.core.test_registry.Widget\)"):
        registry.register("a")(Gadget)


def test_unknown_name_lists_registered():
    registry = Registry("widget")
    registry.register("b")(1)
    registry.register("a")(2)
    with pytest.raises(RegistryError, match=r"unknown widget 'c'; registered widgets: a, b"):
        registry.get("c")


def test_dotted_path_loads_out_of_tree_component():
    assert SCORERS.get("dataflex_rl.scorers:TokenProbScorer") is TokenProbScorer
    with pytest.raises(RegistryError, match="cannot import module 'no_such_module'"):
        SCORERS.get("no_such_module:Thing")
    with pytest.raises(RegistryError, match="has no attribute 'Nope'"):
        SCORERS.get("dataflex_rl.scorers:Nope")


def test_dotted_path_in_config_builds_mechanism():
    mech = build_mechanism(
        {"scorer": {"name": "dataflex_rl.scorers:TokenProbScorer"},
         "actuator": {"name": "dataflex_rl.actuators:AdvantageReweight", "params": {"alpha": 0.2}}}
    )
    assert mech.actuator.params.alpha == 0.2


def test_snapshot_restores_entries():
    with registry_snapshot(ACTUATORS):
        ACTUATORS.register("temporary")(Widget)
        assert Widget.name == "temporary"  # the registry names the class
        assert "temporary" in ACTUATORS
    assert "temporary" not in ACTUATORS


def test_bad_names_refused_at_registration():
    with pytest.raises(ValueError, match="without ':'"):
        Registry("widget").register("a:b")
