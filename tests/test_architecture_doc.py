"""docs/architecture.md's table of what adding a part touches: every file and test it names exists."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE_HEADER = "| Part | You write | Nothing else changes because | Checked by |"


def table_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    lines = text[text.index(TABLE_HEADER):].splitlines()[2:]
    return [line for line in lines[:lines.index("")] if line.startswith("|")]


def test_the_table_has_a_row_per_kind_of_part():
    parts = [row.split("|")[1].strip() for row in table_rows()]
    assert parts == ["scorer / actuator", "task", "logger", "launcher", "backend"]


def test_every_test_the_table_names_exists():
    named = [ref for row in table_rows() for ref in re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", row.split("|")[4])]
    assert len(named) == 6
    for path, test in named:
        source = ROOT / path
        assert source.is_file(), path
        if test:
            functions = {node.name for node in ast.walk(ast.parse(source.read_text()))
                         if isinstance(node, ast.FunctionDef)}
            assert test in functions, f"{path}::{test}"


def test_every_project_file_the_table_names_exists():
    pattern = r"`((?:dataflex_rl|sweeps|conf)/[\w/]+\.(?:py|yaml))`"
    files = {ref for row in table_rows() for ref in re.findall(pattern, row)}
    assert files, "the table names no file"
    missing = sorted(path for path in files if not (ROOT / path).exists())
    assert missing == []
