"""One spelling per concept across the packages: run states, the stable hash, the train config's composition."""

from __future__ import annotations

import ast
import pathlib

import pytest

from dataflex_rl.tracking.run_store import STATES

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("dataflex_rl", "sweeps", "analysis", "benchmarks")
RUN_STORE = ROOT / "dataflex_rl" / "tracking" / "run_store"


def sources() -> list[pathlib.Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def string_constants(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, value) of every string literal that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def calls_to(path: pathlib.Path, attribute: str) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attribute]


def test_run_states_are_spelled_only_by_the_run_store():
    found = [f"{path.relative_to(ROOT)}:{line} {value!r}" for path in sources() if RUN_STORE not in path.parents
             for line, value in string_constants(path) if value in STATES]
    assert found == [], "use the run store's state constants"


def test_one_stable_hash():
    """sha256 over text is computed in dataflex_rl/hashing.py only (a digest fed tensor bytes is not text)."""
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sources() if path.name != "hashing.py"
             for line in calls_to(path, "sha256")
             if "update" not in path.read_text().splitlines()[line - 1] and "sha256()" not in
             path.read_text().splitlines()[line - 1]]
    assert found == [], "use dataflex_rl.hashing.stable_hash"


def test_the_train_config_is_composed_in_one_place():
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sources()
             for line, value in string_constants(path) if value == "train"
             and "config_name" in path.read_text().splitlines()[line - 1]]
    assert len(found) == 1, found


@pytest.mark.parametrize("state", STATES)
def test_the_checks_see_a_planted_literal(tmp_path, state):
    planted = tmp_path / "planted.py"
    planted.write_text(f'"""doc"""\nSTATE = "{state}"\nimport hashlib\nhashlib.sha256(b"x")\n')
    assert (2, state) in string_constants(planted)
    assert calls_to(planted, "sha256") == [4]
