"""Imports point down in every package (dataflex_rl with its backends, sweeps, analysis, benchmarks): no import
circle, function-level imports included, every module in a layer of docs/architecture.md and importing only the
layers below it, and no module importing an entry point."""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dataflex_rl", "sweeps", "analysis", "benchmarks")
# The core: what a mechanism and its config need, importing nothing else of the project.
CORE = tuple(f"dataflex_rl.{name}" for name in (
    "actuators", "dataflex_block", "hashing", "interrupts", "keys", "mechanism", "metrics", "overrides", "registry",
    "scorers", "validation"))
TASKS, TRACKING = ("dataflex_rl.tasks",), ("dataflex_rl.tracking",)
RUN_CONFIG = ("dataflex_rl.run_config", "dataflex_rl.compose")  # every backend's run config and its composition
TINYLM = ("dataflex_rl.tinylm",)
BELOW_BACKENDS = (*CORE, *TASKS, *TRACKING, *RUN_CONFIG, *TINYLM)
# layer -> (its modules, the project's modules it may import), as dotted prefixes, from the bottom up. Any module may
# import the package ``dataflex_rl`` itself (its lazy public names).
LAYERS = {
    "core": (CORE, CORE),
    "tasks": (TASKS, (*CORE, *TASKS)),
    "tracking": (TRACKING, (*CORE, *TRACKING)),
    "run config": (RUN_CONFIG, (*CORE, *TASKS, *TRACKING, *RUN_CONFIG)),
    "tinylm": (TINYLM, (*CORE, *TASKS, *TRACKING, *RUN_CONFIG, *TINYLM)),
    "local": (("dataflex_rl.local",), (*BELOW_BACKENDS, "dataflex_rl.local")),
    "verl": (("dataflex_rl.verl",), (*BELOW_BACKENDS, "dataflex_rl.verl")),
    "analysis": (("analysis",), (*CORE, *TASKS, *TRACKING, "analysis")),
    "sweeps": (("sweeps",), ("dataflex_rl", "analysis", "sweeps")),
    "benchmarks": (("benchmarks",), ("dataflex_rl", "analysis", "sweeps", "benchmarks")),
}
# Entry points (``python -m <module>``): no other module imports one.
ENTRY_POINTS = ("dataflex_rl.local.train", "dataflex_rl.verl.check", "dataflex_rl.verl.record", "sweeps.make",
                "sweeps.__main__", "benchmarks.__main__")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(name: str, path: pathlib.Path) -> set[str]:
    """Every dotted name a module imports anywhere in its body (``from pkg import sub`` counts ``pkg.sub``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                anchor = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*anchor, base] if base else anchor)
            names.update({base, *(f"{base}.{alias.name}" for alias in node.names)})
    return names


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports. A module importing one of its own packages imports the
    package's public face, not itself: that edge is left out."""
    modules = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        parents = {".".join(name.split(".")[:depth]) for depth in range(1, name.count(".") + 1)}
        graph[name] = {other for other in imported_names(name, path) & set(modules) if other not in {name, *parents}}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: the strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = lowest[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                lowest[node] = min(lowest[node], lowest[successor])
            elif successor in stack:
                lowest[node] = min(lowest[node], index[successor])
        if lowest[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)


def test_no_import_circles():
    assert circles(import_graph()) == []


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_the_layers_below(layer):
    graph = import_graph()
    modules, allowed = LAYERS[layer]
    wrong = sorted(f"{name} -> {other}" for name in graph if within(name, modules)
                   for other in graph[name] if other != "dataflex_rl" and not within(other, allowed))
    assert wrong == []


def test_every_module_is_in_a_layer():
    placed = [prefix for modules, _ in LAYERS.values() for prefix in modules]
    assert sorted(name for name in import_graph() if name not in PACKAGES and not within(name, tuple(placed))) == []


def test_no_module_imports_an_entry_point():
    wrong = sorted(f"{name} -> {other}" for name, imported in import_graph().items() for other in imported
                   if other in ENTRY_POINTS and other != name)
    assert wrong == []


def test_the_circle_finder_finds_one():
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": set()}) == []
