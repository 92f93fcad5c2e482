"""Results files: every results table the docs show equals the file a command wrote, and the command writes it from a
sweep's run stores."""

from __future__ import annotations

from pathlib import Path

from analysis import results
from tests.analysis.synthetic import write_fake_sweep


def test_every_results_block_in_the_docs_equals_its_file_and_every_file_is_shown():
    assert results.stale_blocks() == []
    assert results.main(["--check"]) == 0
    shown = {name for path in results.doc_files() for name, _ in results.embedded_blocks(path.read_text())}
    files = {path.stem for path in results.RESULTS_DIR.glob("*.md")}
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
