"""Imports in the core, tracking, the local backend and the sweep driver point one way: no module reaches itself
again (function-level imports too)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of ``folder`` it imports anywhere in its body (``from pkg import sub`` counts sub)."""
    modules = {module_name(path): path for path in (ROOT / folder).glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
        # A package's __init__ re-exports its modules; a module importing a sibling names the sibling, not the package.
        package = folder.replace("/", ".")
        graph[name] = {other for other in imported & set(modules) if other not in (name, package)}
    return graph


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for successor in sorted(graph[node]):
            if successor == start:
                return [*path, start]
            if successor not in seen:
                seen.add(successor)
                stack.append((successor, [*path, successor]))
    return None


@pytest.mark.parametrize(
    "folder", ["dataflex_rl", "dataflex_rl/tracking", "dataflex_rl/tracking/run_store", "dataflex_rl/local", "sweeps"]
)
def test_no_import_cycles(folder):
    graph = import_graph(folder)
    cycles = [cycle for cycle in (cycle_from(graph, name) for name in sorted(graph)) if cycle]
    assert cycles == []


def test_the_cycle_finder_finds_one():
    assert cycle_from({"a": {"b"}, "b": {"a"}, "c": set()}, "a") == ["a", "b", "a"]
    assert cycle_from({"a": {"b"}, "b": set()}, "a") is None
