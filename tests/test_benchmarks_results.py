"""``python -m benchmarks --name RESULTS``: the table written as a results file naming its command and the load."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import main, results_text
from benchmarks.common import Row, format_table


def test_the_results_text_holds_the_command_the_table_and_the_load():
    table = format_table([Row("sweep", "parallel efficiency (speed-up / jobs)", "", None, (0.9, 0.95))])
    text = results_text("bench", ["sweep", "--name", "bench"], table, (0.25, 1.75))
    lines = text.splitlines()
    assert lines[0] == "<!-- bench: written by `python -m benchmarks sweep --name bench`; do not edit by hand -->"
    assert "| sweep | parallel efficiency (speed-up / jobs) | - | 0.9 / 0.95  | - |  |" in lines
    assert lines[-1].endswith("load average (1 min) 0.2 at the start, 1.8 at the end")


def test_a_bad_results_name_is_refused_before_any_benchmark_runs(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--name", "../bench"])
    assert "--name = '../bench' is not allowed" in capsys.readouterr().err
