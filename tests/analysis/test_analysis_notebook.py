"""``notebooks/alpha_sweep.ipynb`` is committed without outputs and runs top to bottom against a fake sweep."""

from __future__ import annotations

import re
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
    markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert len(markdown) == 2 and all(m.count("\n") == 4 for m in markdown)  # header, rule, 3 alphas each
    assert "val/accuracy after SFT (step 0)" in markdown[0]  # the summary table of the report and the sweep
    tables = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert "<table" in tables[-1]  # the one long table, grouped
    differences = next(cell for cell in notebook.cells if cell.cell_type == "code" and "curve_differences" in cell.source)
    figures = [o for o in differences.outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(figures) == 3  # alpha 0.25 and 0.5 against alpha 0, then the sample-efficiency curves


def test_the_notebook_extra_is_installed_and_jupyterlab_starts() -> None:
    import subprocess
    import sys
    import tomllib

    import jupyterlab

    project = tomllib.loads((NOTEBOOK.parents[1] / "pyproject.toml").read_text())["project"]
    assert "jupyterlab>=4" in project["optional-dependencies"]["notebook"]
    assert int(jupyterlab.__version__.split(".")[0]) >= 4
    version = subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True,
                             timeout=120, check=True).stdout.strip()
    assert version == jupyterlab.__version__


def test_make_notebook_opens_the_last_sweep(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.fail("make is not installed; `make notebook` cannot be checked")
    repo = NOTEBOOK.parents[1]
    dry_run = subprocess.run(["make", "-n", "-o", ".venv/.installed", "notebook", "SWEEP=demo"], cwd=repo,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert "-m sweeps.make notebook-dir" in dry_run and "demo" not in dry_run  # SWEEP travels as data
    assert re.search(r"-m jupyterlab (--allow-root )?notebooks/alpha_sweep.ipynb", dry_run)  # root: --allow-root
