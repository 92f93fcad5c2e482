"""The numeric environment in the analysis: the run table's ``environment`` label, the report's Environment section
and its warning when runs of several environments are compared."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import aggregate, environment, frames, load, report
from tests.analysis.synthetic import write_fake_run
from dataflex_rl.tracking import RunIdentity, RunStore, run_store

VARIABLE = "ATEN_CPU_CAPABILITY"
XEON = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512", "aten_cpu_capability": None, "blas": "mkl",
        "threads": 1, "machine": "x86_64"}
FAST = ["--bootstrap", "200"]


def _section_table(text: str, heading: str) -> list[list[str]]:
    """The cells of the first Markdown table under ``heading``, header row first (the separator row dropped)."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in section.splitlines() if line.startswith("|")]
    return rows[:1] + rows[2:]


def _run(sweep: Path, alpha: float, seed: int) -> Path:
    return write_fake_run(sweep / f"a{alpha:g}-s{seed}", sweep=sweep.name, alpha=alpha, seed=seed, steps=[0, 5, 10],
                          metrics={"val/accuracy": [0.5, 0.55 + alpha / 10, 0.6 + alpha / 10]})


def _resume(run_dir: Path) -> None:
    """A second session of a written run, under whatever environment the test set."""
    recorded = run_store.read_meta(run_dir)
    fields = {key: recorded[key] for key in RunIdentity.__dataclass_fields__ if key in recorded}
    RunStore(run_dir).write_meta(RunIdentity(**fields))


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_variable: str | None) -> Path:
    """alpha 0 and 0.5, seed 1: the first written without ``ATEN_CPU_CAPABILITY``, the second with
    ``second_variable`` (None: without it too)."""
    sweep = tmp_path / "sweep-env"
    monkeypatch.delenv(VARIABLE, raising=False)
    _run(sweep, 0.0, 1)
    if second_variable is not None:
        monkeypatch.setenv(VARIABLE, second_variable)
    _run(sweep, 0.5, 1)
    monkeypatch.delenv(VARIABLE, raising=False)
    return sweep


def test_label_parts_hand_written() -> None:
    assert environment.environment_label({"environment": XEON}) == (
        "AVX512 · mkl · 1 thread · Intel(R) Xeon(R) Processor (x86_64)")
    capped = {**XEON, "cpu_capability": "AVX2", "aten_cpu_capability": "avx2", "threads": 4}
    assert environment.environment_label({"environment": capped}) == (
        "AVX2 (ATEN_CPU_CAPABILITY=avx2) · mkl · 4 threads · Intel(R) Xeon(R) Processor (x86_64)")
    # each change names what differs from the environment before it
    resumed = {"environment": XEON, "environment_changes": [{**capped, "time": "t1"}, {**XEON, "time": "t2"}]}
    assert environment.environment_label(resumed) == (
        "AVX512 · mkl · 1 thread · Intel(R) Xeon(R) Processor (x86_64) · resumed under "
        "AVX2 (ATEN_CPU_CAPABILITY=avx2), 4 threads; then AVX512, 1 thread")
    assert environment.environment_label({"run": "hand-made"}) is None


def test_loader_environment_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _sweep(tmp_path, monkeypatch, second_variable="avx2")
    hand_made = _run(sweep, 1.0, 1)
    meta = run_store.read_meta(hand_made)
    del meta["environment"]
    run_store.atomic_write_json(hand_made / run_store.META_FILE, meta)
    runs = load.load_sweep(sweep).runs.set_index("run")
    first = runs.loc[f"{sweep.name}-a0-s1", "environment"]
    capped = runs.loc[f"{sweep.name}-a0.5-s1", "environment"]
    expected = environment.environment_label(run_store.read_meta(sweep / "a0-s1"))
    assert first == expected and first.startswith(f"{run_store.numeric_environment()['cpu_capability']} · ")
    assert "ATEN_CPU_CAPABILITY" not in first and "(ATEN_CPU_CAPABILITY=avx2) · " in capped
    assert pd.isna(runs.loc[f"{sweep.name}-a1-s1", "environment"])
    # a label, not a swept factor: runs of two environments are not grouped by it
    frame = load.load_sweep(sweep).runs
    assert "environment" not in frames.factor_columns(frame)
    assert "environment" not in aggregate.default_group_keys(frame)


def test_environment_table_and_warning_from_a_run_table() -> None:
    labels = {"r1": "AVX512 · mkl · 1 thread · CPU (x86_64)", "r2": "AVX512 · mkl · 1 thread · CPU (x86_64)",
              "r3": "AVX2 (ATEN_CPU_CAPABILITY=avx2) · mkl · 1 thread · CPU (x86_64)", "r4": None, "r5": "excluded"}
    runs = pd.DataFrame({"run": list(labels), "environment": list(labels.values()),
                         "included": [True, True, True, True, False]})
    table = environment.environment_table(runs)
    assert list(table.columns) == ["CPU kernels", "BLAS", "threads", "CPU", "runs", "run names"]
    assert table["CPU kernels"].tolist() == ["AVX512", "AVX2 (ATEN_CPU_CAPABILITY=avx2)", "unknown"]
    assert table["runs"].tolist() == [2, 1, 1] and table["run names"].tolist() == ["r1, r2", "r3", "r4"]
    warning = environment.mixed_environment_warning(runs)
    assert warning.startswith("**Runs from 3 numeric environments are compared**")
    assert "(2 runs: r1, r2)" in warning and "difference between machines" in warning
    same = runs[runs["run"].isin(["r1", "r2", "r5"])]
    assert environment.mixed_environment_warning(same) is None  # an excluded run does not count
    assert len(environment.environment_table(same)) == 1
    alone = pd.DataFrame({"run": ["r6"], "environment": [f"{labels['r1']} · resumed under 4 threads"],
                          "included": [True]})
    assert environment.mixed_environment_warning(alone).startswith("**A run changed numeric environment on resume**")
    assert environment.environment_table(alone)["resumed under"].tolist() == ["4 threads"]
    assert environment.abbreviated([f"r{i}" for i in range(9)]) == "r0, r1, r2, r3, ... (9 in all)"


def test_report_same_environment_lists_it_without_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _sweep(tmp_path, monkeypatch, second_variable=None)
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    header, *rows = _section_table(text, "## Environment")
    assert header == ["CPU kernels", "BLAS", "threads", "CPU", "runs", "run names"]
    assert len(rows) == 1 and rows[0][4:] == ["2", f"{sweep.name}-a0-s1, {sweep.name}-a0.5-s1"]
    assert rows[0][0] == run_store.numeric_environment()["cpu_capability"]
    assert text.index("## Excluded runs") < text.index("## Environment") < text.index("## Figures")
    assert "numeric environments are compared" not in text and "changed numeric environment" not in text


def test_report_warns_when_environments_differ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _sweep(tmp_path, monkeypatch, second_variable="avx2")
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    warnings = text.split("## Warnings", 1)[1].split("\n## ", 1)[0]
    assert "**Runs from 2 numeric environments are compared**" in warnings
    assert "CPU kernels change a run's numbers (e.g. the warm start's accuracy)" in warnings
    _, *rows = _section_table(text, "## Environment")
    assert sorted(row[0].endswith("(ATEN_CPU_CAPABILITY=avx2)") for row in rows) == [False, True]
    assert [row[4] for row in rows] == ["1", "1"]


def test_report_warns_about_a_run_resumed_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = _sweep(tmp_path, monkeypatch, second_variable=None)
    monkeypatch.setenv(VARIABLE, "avx2")
    _resume(sweep / "a0.5-s1")
    monkeypatch.delenv(VARIABLE)
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "**Runs from 2 numeric environments are compared**" in text
    assert "a run resumed under another environment mixes two within itself" in text
    header, *rows = _section_table(text, "## Environment")
    assert header == ["CPU kernels", "BLAS", "threads", "CPU", "resumed under", "runs", "run names"]
    resumed = {row[6]: row[4] for row in rows}
    # this process's kernels were fixed when torch started: only the variable changed
    kernels = run_store.numeric_environment()["cpu_capability"]
    assert resumed == {f"{sweep.name}-a0-s1": "", f"{sweep.name}-a0.5-s1": f"{kernels} (ATEN_CPU_CAPABILITY=avx2)"}
