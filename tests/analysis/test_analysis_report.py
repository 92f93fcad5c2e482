"""``python -m analysis.report`` in-process: files, one table row per alpha, excluded runs, missing sections."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis import report, report_figures
from tests.analysis.synthetic import fake_metrics, write_fake_run, write_fake_sweep

FAST = ["--bootstrap", "200"]


def _table_rows(markdown: str, heading: str) -> list[str]:
    """Data rows of the first Markdown table after ``heading``."""
    section = markdown.split(heading, 1)[1]
    table: list[str] = []
    for line in section.splitlines():
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return table[2:]


def test_report_files_rows_and_excluded_runs(fake_sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(fake_sweep), *FAST, "--threshold", "val/accuracy=0.4"]) == 0
    out_dir = fake_sweep / "report"
    assert f"report written to {out_dir / 'report.md'}" in capsys.readouterr().out
    text = (out_dir / "report.md").read_text()
    for stem in ("table_final_window", "table_auc"):
        for suffix in ("md", "csv", "tex", "html"):
            assert (out_dir / f"{stem}.{suffix}").is_file()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(images) == 11 and all((out_dir / image).is_file() for image in images)
    rows = _table_rows(text, "## Final-window mean")
    assert [row.split("|")[1].strip() for row in rows] == ["0", "0.5", "1"]  # one row per alpha
    csv = pd.read_csv(out_dir / "table_final_window.csv")
    assert sorted(csv[csv["metric"] == "val/accuracy"]["alpha"]) == [0.0, 0.5, 1.0]
    excluded = _table_rows(text, "## Excluded runs")
    assert len(excluded) == 3 and "loss became NaN" in text and "state running" in text
    assert "## Steps to threshold" in text
    assert (out_dir / "runs.csv").is_file()


def test_report_without_histograms_grad_stats_or_validation(tmp_path: Path) -> None:
    sweep = write_fake_sweep(tmp_path / "bare", alphas=(0.0, 1.0), seeds=(1, 2), n_steps=12, histograms=False,
                             grad_stats=False, write_manifest=False)
    out_dir = tmp_path / "out"
    assert report.main([str(sweep), "--out", str(out_dir), *FAST, "--metric", "critic/score/mean",
                        "--metric", "not/logged"]) == 0
    text = (out_dir / "report.md").read_text()
    assert "Skipped: no `dataflex/hist/weight` histograms" in text
    assert "Skipped: no `grad_norm/by_prob/<bucket>/<stat>` metrics" in text
    assert "left out): not/logged" in text
    assert len(_table_rows(text, "## Final-window mean")) == 2
    assert not (sweep / "report").exists()


def test_report_with_only_failed_runs_and_a_damaged_run(tmp_path: Path) -> None:
    sweep = tmp_path / "broken"
    write_fake_run(sweep / "crashed", sweep="broken", run="crashed", state="failed", error="OOM", alpha=0.0, seed=1,
                   metrics={"val/accuracy": [0.1, 0.2]}, metrics_format="jsonl")
    damaged = write_fake_run(sweep / "damaged", sweep="broken", run="damaged", alpha=0.5, seed=1,
                             metrics={"val/accuracy": [0.1, 0.2]})
    (damaged / "metrics.parquet").write_bytes(b"garbage")
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "No completed runs." in text and "state failed: OOM" in text and "unreadable metrics.parquet" in text


def test_report_missing_folder_and_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "--threshold", "no-equals-sign"])


def test_report_groups_by_mechanism_label_with_baseline(tmp_path: Path) -> None:
    sweep = tmp_path / "labels"
    grid = [("baseline", 0.0), ("ar", 0.5), ("ar", 1.0), ("lopti", 0.5)]
    for label, alpha in grid:
        for seed in (1, 2):
            name = f"{label}-a{alpha:g}-s{seed}"
            write_fake_run(sweep / name, sweep="labels", run=name, alpha=alpha, seed=seed, mechanism_label=label,
                           metrics=fake_metrics(alpha, seed, 12, grad_stats=False, random_state=seed))
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "Groups: mechanism_label, alpha." in text and "Baseline: mechanism_label=baseline, alpha=0." in text
    rows = _table_rows(text, "## Final-window mean")
    assert [tuple(cell.strip() for cell in row.split("|")[1:3]) for row in rows] == [
        ("ar", "0.5"), ("ar", "1"), ("baseline", "0"), ("lopti", "0.5")]
    # the label cell plus "baseline" in the delta column of each of the 4 default metrics
    assert rows[2].count("baseline") == 1 + 4
    assert report.main([str(sweep), "--group-key", "temperature"]) == 2


def test_report_groups_by_a_config_column(complete_sweep: Path) -> None:
    out_dir = complete_sweep / "by-config"
    assert report.main([str(complete_sweep), "--out", str(out_dir), *FAST,
                        "--group-key", "config.dataflex.actuator.params.alpha"]) == 0
    text = (out_dir / "report.md").read_text()
    rows = _table_rows(text, "## Final-window mean")
    assert [row.split("|")[1].strip() for row in rows] == ["0", "0.5", "1"]
    assert "No deltas" in text  # the baseline is looked up by alpha, not by a config column
    assert "Could not draw" not in text


def test_report_of_a_folder_of_sweeps_is_refused_and_writes_nothing(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    for name in ("sweep-a", "sweep-b"):
        write_fake_sweep(runs / name, alphas=(0.0, 0.5), seeds=(1, 2), n_steps=6, histograms=False)
    before = sorted(path.name for path in runs.iterdir())
    assert report.main([str(runs)]) == 2
    error = capsys.readouterr().err
    assert f"{runs} is a folder of sweeps (sweep-a, sweep-b), not one sweep" in error and "Traceback" not in error
    assert sorted(path.name for path in runs.iterdir()) == before  # no metrics.parquet, runs.parquet, report/


def test_make_report_without_sweep_takes_the_newest_sweep(tmp_path: Path, monkeypatch) -> None:
    import os

    from sweeps import make

    runs = tmp_path / "runs"
    for name in ("sweep-a", "sweep-b"):
        write_fake_sweep(runs / name, alphas=(0.0,), seeds=(1,), n_steps=4, histograms=False)
    os.utime(runs / "sweep-a" / "sweep.json", (2e9, 2e9))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DATAFLEX_SWEEP_DIR", raising=False)
    assert make.command("report", make.variables({}))[-1] == str(runs / "sweep-a")


def _small_sweep(sweep: Path, lengths=(10, 10, 10, 10), nan_last: bool = False) -> list[Path]:
    runs = []
    for index, ((alpha, seed), length) in enumerate(zip([(0.0, 1), (0.0, 2), (0.5, 1), (0.5, 2)], lengths,
                                                        strict=True)):
        values = [0.1 + 0.01 * step + alpha for step in range(length)]
        accuracy = [float("nan")] * length if nan_last and index == 3 else values
        runs.append(write_fake_run(sweep / f"a{alpha}-s{seed}", sweep=sweep.name, run=f"a{alpha}-s{seed}", alpha=alpha,
                                   seed=seed, metrics={"val/accuracy": accuracy, "critic/score/mean": values},
                                   metrics_format="both"))
    return runs


def test_a_killed_report_leaves_the_previous_one_whole(tmp_path: Path, monkeypatch) -> None:
    sweep = tmp_path / "s"
    _small_sweep(sweep)
    assert report.main([str(sweep), *FAST]) == 0
    before = {path.name: path.read_bytes() for path in (sweep / "report").iterdir()}
    calls = []

    def killed(figure, stem):  # the process dies while the second figure is being written
        calls.append(stem)
        if len(calls) == 2:
            Path(f"{stem}.png").write_bytes(b"")
            raise KeyboardInterrupt
        return original(figure, stem)

    original = report_figures.plots.save_figure
    monkeypatch.setattr(report_figures.plots, "save_figure", killed)
    with pytest.raises(KeyboardInterrupt):
        report.main([str(sweep), *FAST])
    assert {path.name: path.read_bytes() for path in (sweep / "report").iterdir()} == before
    assert [path.name for path in sweep.iterdir() if path.name.endswith(".partial")] == []


def test_a_completed_run_with_damaged_metrics_is_excluded_and_named(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    damaged = _small_sweep(sweep)[3]
    (damaged / "metrics.parquet").write_bytes((damaged / "metrics.parquet").read_bytes()[:100])
    lines = (damaged / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[2] = '{"step": 2, "val/acc\n'
    (damaged / "metrics.jsonl").write_text("".join(lines))
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "Runs: 3 included, 1 excluded." in text
    assert re.search(r"a0\.5-s2 .*unreadable metrics\.jsonl .*line 3 is not a run-store record", text)


def test_the_report_warns_of_runs_of_other_lengths_and_runs_without_the_metric(tmp_path: Path) -> None:
    sweep = tmp_path / "s"
    _small_sweep(sweep, lengths=(10, 20, 40, 10), nan_last=True)
    assert report.main([str(sweep), *FAST]) == 0
    text = (sweep / "report" / "report.md").read_text()
    assert "**Runs of different lengths are compared**: 9 steps: a0.0-s1, a0.5-s2; 19 steps: a0.0-s2; 39 steps: " \
           "a0.5-s1." in text
    assert "1 included run(s) logged no finite `val/accuracy`, so they are left out of its n: a0.5-s2." in text


def test_two_reports_of_one_sweep_at_once_take_turns(tmp_path: Path, monkeypatch) -> None:
    """make report SWEEP=s & make report SWEEP=s (two at the same time)"""
    import threading

    sweep = tmp_path / "s"
    _small_sweep(sweep)
    data = report.load_sweep(sweep)
    first_writing, results = threading.Event(), {}
    original = report_figures.plots.save_figure

    def slow_first(figure, stem):  # the first report is writing its figures when the second one starts
        if not first_writing.is_set():
            first_writing.set()
            time.sleep(1.0)
        return original(figure, stem)

    monkeypatch.setattr(report_figures.plots, "save_figure", slow_first)

    def write(name: str) -> None:
        try:
            results[name] = report.write_report(data, sweep / "report", report.ReportOptions(n_bootstrap=200))
        except Exception as error:  # noqa: BLE001 - the test reports what each writer met
            results[name] = error

    first = threading.Thread(target=write, args=("first",))
    first.start()
    assert first_writing.wait(30)
    second = threading.Thread(target=write, args=("second",))
    second.start()
    first.join(120)
    second.join(120)
    assert results == {"first": sweep / "report" / "report.md", "second": sweep / "report" / "report.md"}
    text = (sweep / "report" / "report.md").read_text()
    assert "Could not draw" not in text and "FileNotFoundError" not in text
    assert [path.name for path in sweep.iterdir() if path.name.endswith(".partial")] == []


def test_the_headline_table_gives_each_groups_gain_over_its_own_warm_start(tmp_path: Path) -> None:
    # seed s: 0.2 after SFT (step 0), then 0.5 + 0.01 s for the 5 evaluations of the final window, so the gains are
    # 0.31, 0.32, 0.33: mean 0.32, 95% t interval 0.32 +- t(0.975, 2) 0.01 / sqrt(3) = 0.32 +- 0.0248.
    from analysis.load import load_sweep
    from dataflex_rl import keys

    for alpha in (0.0, 0.5):
        for seed in (1, 2, 3):
            write_fake_run(tmp_path / "s" / f"a{alpha:g}-s{seed}", sweep="s", alpha=alpha, seed=seed,
                           metrics={keys.VAL_ACCURACY: [0.2] + [0.5 + 0.01 * seed] * 5})
    table = report.to_markdown(report.summary_table(load_sweep(tmp_path / "s")))
    header, _, *rows = table.splitlines()
    assert "val/accuracy gain over SFT (final - step 0)" in header
    assert all("0.320 ± 0.025 (3)" in row for row in rows)


def test_a_metric_equal_to_an_earlier_one_at_every_step_is_tabled_once(tmp_path: Path) -> None:
    # a 0/1 reward makes train/accuracy the mean reward critic/score/mean: one column, and a note naming the other;
    # a graded reward (Knights and Knaves) gives two numbers, so both columns stay
    from dataflex_rl import keys

    for name, graded in (("binary", False), ("graded", True)):
        for alpha in (0.0, 0.5):
            for seed in (1, 2, 3):
                score = [0.1 * seed, 0.2 + alpha, 0.3, 0.4 * seed]
                accuracy = [value - 0.05 for value in score] if graded else score
                write_fake_run(tmp_path / name / f"a{alpha:g}-s{seed}", sweep=name, alpha=alpha, seed=seed,
                               metrics={keys.SCORE_MEAN: score, keys.TRAIN_ACCURACY: accuracy})
        assert report.main([str(tmp_path / name), *FAST]) == 0
    note = "Shown once: `train/accuracy` equals `critic/score/mean` at every step of every run"
    for name, shown in (("binary", False), ("graded", True)):
        out = tmp_path / name / "report"
        text = (out / "report.md").read_text()
        for heading in ("## Final-window mean", "## Area under the curve"):
            header = text.split(heading, 1)[1].split("\n|", 1)[1].split("\n", 1)[0]
            columns = [cell.strip() for cell in header.split("|")]
            assert "critic/score/mean" in columns and ("train/accuracy" in columns) == shown, (name, heading)
        assert (note in text) == (not shown)
        csv = pd.read_csv(out / "table_final_window.csv")
        assert set(csv["metric"]) == {keys.SCORE_MEAN, *([keys.TRAIN_ACCURACY] if shown else [])}
