"""Results files: every results table the docs show equals the file a command wrote, and the command writes it from a
sweep's run stores."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis import results
from dataflex_rl.validation import ConfigError
from tests.analysis.synthetic import write_fake_sweep


def test_every_results_block_in_the_docs_equals_its_file_and_every_file_is_shown():
    assert results.stale_blocks() == []
    assert results.main(["--check"]) == 0
    shown = {name for path in results.doc_files() for name, *_ in results.block_spans(path.read_text())}
    files = {path.stem for path in results.RESULTS_DIR.glob("*.md")} - {results.ARCHIVE}
    assert files, "docs/results/ holds the results files the docs show"
    assert files <= shown, f"results files no doc shows: {sorted(files - shown)}"


def test_a_results_file_is_written_from_a_sweep_and_the_docs_blocks_follow_it(tmp_path: Path):
    sweep = write_fake_sweep(tmp_path / "runs" / "sweep-r", alphas=(0.0, 0.5), seeds=(1, 2, 3), n_steps=10)
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("intro\n<!-- results: demo -->\nold table\n<!-- /results -->\nend\n")
    (root / "docs" / "page.md").write_text("<!-- results: other -->\nkept\n<!-- /results -->\n")

    path, changed = results.write_results(sweep, "demo", root)

    text = path.read_text()
    assert path == root / "docs" / "results" / "demo.md"
    assert text.startswith("<!-- demo: written by `make docs-results SWEEP=sweep-r RESULTS=demo` from 6 runs")
    assert "alpha |" in text and "val/accuracy final" in text  # the report's summary table
    assert "Design:" in text and "evaluation items" in text  # what the intervals cover
    assert "- numeric environment: `" in text and "(6 runs)" in text and "- torch " in text
    assert changed == [root / "README.md"]
    readme = (root / "README.md").read_text()
    assert readme == f"intro\n<!-- results: demo -->\n{text}<!-- /results -->\nend\n"
    assert (root / "docs" / "page.md").read_text() == "<!-- results: other -->\nkept\n<!-- /results -->\n"
    assert results.stale_blocks(root) == ["docs/page.md: other (no docs/results/other.md)"]

    (root / "README.md").write_text(readme.replace("Design:", "Design (edited):"))
    stale = results.stale_blocks(root)
    assert stale[0].startswith("README.md: demo (differs from docs/results/demo.md")
    results.write_results(sweep, "demo", root)  # the command puts the docs back to its file
    assert results.stale_blocks(root) == ["docs/page.md: other (no docs/results/other.md)"]


def _repo_with(tmp_path: Path, readme: str) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(readme)
    return root


def _files(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): path.read_text() for path in sorted(root.rglob("*")) if path.is_file()}


def test_a_results_name_too_long_for_a_file_is_refused_before_anything_is_read_or_written(tmp_path: Path, capsys):
    root = _repo_with(tmp_path, "intro\n")
    with pytest.raises(ConfigError, match=r"RESULTS = 'aaaaaaaaaaaaaaaaaaaa'\.\.\. \(300 characters\) is not allowed: "
                                          r"a results name .* has at most 128 characters"):
        results.write_results(tmp_path / "no-sweep", "a" * 300, root)
    assert _files(root) == {"README.md": "intro\n"}
    assert results.main([str(tmp_path / "no-sweep"), "--name", "a" * 300]) == 2
    assert "has at most 128 characters" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-rf", "a/b", "naïve"])
def test_a_results_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, name: str):
    """``..`` wrote ``docs/results/...md``, ``.`` a hidden ``..md``."""
    sweep = write_fake_sweep(tmp_path / "runs" / "sweep-r", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=4)
    root = _repo_with(tmp_path, "intro\n")
    with pytest.raises(ConfigError, match=rf"RESULTS = {re.escape(repr(name))} is not allowed: a results name"):
        results.write_results(sweep, name, root)
    assert _files(root) == {"README.md": "intro\n"}


def test_the_writer_refuses_a_doc_whose_block_is_not_closed_and_writes_nothing(tmp_path: Path):
    """An unclosed block ran to the next block's end: writing it erased that block's opening line."""
    sweep = write_fake_sweep(tmp_path / "runs" / "sweep-r", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=4)
    readme = "<!-- results: demo -->\nold\n<!-- results: other -->\nkept\n<!-- /results -->\n"
    root = _repo_with(tmp_path, readme)
    with pytest.raises(ValueError, match=r"README\.md:3: block 'other' opens inside block 'demo' \(README\.md:1\)"):
        results.write_results(sweep, "demo", root)
    assert _files(root) == {"README.md": readme}  # no results file, no doc changed


@pytest.mark.parametrize(("doc", "problem"), [
    ("<!-- results: demo -->\nbody\n", "docs/page.md:1: block 'demo' has no '<!-- /results -->' line"),
    ("text\n<!--results: demo-->\nbody\n<!-- /results -->\n", "docs/page.md:2: '<!--results: demo-->' is not a "
                                                              "results marker"),
    ("see <!-- results: demo -->\nbody\n<!-- /results -->\n", "docs/page.md:1: 'see <!-- results: demo -->' is not "
                                                              "a results marker"),
    ("<!-- results: a b -->\nbody\n<!-- /results -->\n", "docs/page.md:1: '<!-- results: a b -->' is not a "
                                                         "results marker"),
    ("<!-- results: .. -->\nbody\n<!-- /results -->\n", "docs/page.md:1: the block's name = '..' is not allowed"),
    ("body\n<!-- /results -->\n", "docs/page.md:2: '<!-- /results -->' closes no block"),
])
def test_check_reports_every_marker_that_is_not_well_formed(tmp_path: Path, doc: str, problem: str):
    root = _repo_with(tmp_path, "intro\n")
    (root / "docs" / "page.md").write_text(doc)
    (root / "docs" / "results").mkdir()
    (root / "docs" / "results" / "demo.md").write_text("body\n")
    stale = results.stale_blocks(root)
    assert len(stale) == 1 and stale[0].startswith(problem), stale


def test_a_doc_that_is_not_utf8_is_named_by_check_and_refused_by_the_writer(tmp_path: Path, capsys):
    sweep = write_fake_sweep(tmp_path / "runs" / "sweep-r", alphas=(0.0, 0.5), seeds=(1, 2), n_steps=4)
    root = _repo_with(tmp_path, "intro\n")
    (root / "docs" / "latin1.md").write_bytes("caf\xe9\n".encode("latin-1"))
    assert results.stale_blocks(root) == ["docs/latin1.md: not UTF-8 text (invalid continuation byte at byte 3)"]
    with pytest.raises(ValueError, match=r"docs/latin1\.md: not UTF-8 text"):
        results.write_results(sweep, "demo", root)
    assert not (root / "docs" / "results").exists()
