"""``notebooks/alpha_sweep.ipynb`` is committed without outputs and runs top to bottom against a fake sweep."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "alpha_sweep.ipynb"


def test_notebook_is_committed_without_outputs() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(not cell.outputs and cell.execution_count is None for cell in code_cells)


def test_notebook_executes_against_a_fake_sweep(fake_sweep: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAFLEX_SWEEP_DIR", str(fake_sweep))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert f"{fake_sweep}: 6 runs included, 3 excluded" in text
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) >= 9  # 2 curves, final vs alpha, heatmaps, histogram, low-prob share, 3 gradient bar charts
    markdown = [o for o in outputs if "text/markdown" in o.get("data", {})]
    assert len(markdown) == 1 and markdown[0]["data"]["text/markdown"].count("\n") == 4  # header, rule, 3 alphas
