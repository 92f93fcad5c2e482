"""The SFT recipe search (python -m sweeps.sft_search): each point's warm starts measured and written as one row."""

from __future__ import annotations

import pytest

from sweeps import sft_search


def test_a_point_is_measured_per_seed_and_written_as_one_row():
    point = {"num_layers": 1, "lr": 0.003, "batch_size": 4, "warmup_steps": 2, "target_accuracy": 0.99, "check_every": 2}
    ((measured_point, measured),) = sft_search.search([point], seeds=[1, 2], cap=3, jobs=1)
    assert measured_point == point and [m.steps for m in measured] == [3, 3]  # a tiny model never reaches 0.99
    assert all(m.reached is False and m.cpu_seconds > 0 and 0 <= m.val_accuracy <= 1 for m in measured)
    text = sft_search.results_text("probe", [(point, measured)], [1, 2], 3, ["--cap", "3"], 60.0)
    assert text.startswith("<!-- probe: written by `python -m sweeps.sft_search --cap 3`; do not edit by hand -->")
    row = next(line for line in text.splitlines() if line.startswith("| 1 | 0.003 |"))
    accuracies = ", ".join(f"{m.val_accuracy:.3f}" for m in measured)
    assert row.startswith("| 1 | 0.003 | 4 | 2 | 0.99 | 2 | 3, 3 | ")
    assert f"| {accuracies} |" in row and row.endswith("| 0/2 |")


def test_a_bad_value_is_refused_naming_the_flag_before_anything_trains(capsys):
    with pytest.raises(SystemExit):
        sft_search.main(["--lr", "fast"])
    assert "--lr = 'fast' is not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sft_search.main(["--target", "1.5"])
    assert "target_accuracy = 1.5 is not allowed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sft_search.main(["--layers", "0"])
    assert "num_layers = 0 is not allowed" in capsys.readouterr().err
