"""The regime map: a synthetic alpha x lr x temperature sweep with an effect planted in one cell; the paired deltas
frame that cell only, and the heatmap draws every cell with its interval."""

from __future__ import annotations

import itertools
import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

from analysis.aggregate import paired_differences
from analysis.plots.regime import plot_regime_map, regime_cells
from analysis.report import build_report
from dataflex_rl import keys
from tests.analysis.synthetic import write_fake_run

matplotlib.use("Agg")
LRS, TEMPERATURES, SEEDS = (1e-4, 3e-4), (0.7, 1.0, 1.3), range(1, 9)
PLANTED = (3e-4, 1.3)  # alpha 0.5 gains 0.1 here and nowhere else


def synthetic_summaries() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for lr, temperature, seed in itertools.product(LRS, TEMPERATURES, SEEDS):
        shared = rng.normal(0.5, 0.05)  # the seed's draw, common to both alphas (what pairing removes)
        for alpha in (0.0, 0.25, 0.5):
            effect = 0.1 if alpha == 0.5 and (lr, temperature) == PLANTED else 0.0
            rows.append({"alpha": alpha, "trainer.lr": lr, "trainer.temperature": temperature, "seed": seed,
                         "metric": "val/accuracy", "final_window": shared + effect + rng.normal(0, 0.005)})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def differences():
    return paired_differences(synthetic_summaries(), group_keys=("alpha", "trainer.lr", "trainer.temperature"))


def test_only_the_planted_cell_excludes_zero(differences):
    cells = regime_cells(differences, "trainer.lr", "trainer.temperature", metric="val/accuracy",
                         where={"alpha": 0.5})
    assert len(cells) == len(LRS) * len(TEMPERATURES) and set(cells["n_pairs"]) == {len(SEEDS)}
    framed = cells[cells["excludes_zero"]]
    assert list(zip(framed["trainer.lr"], framed["trainer.temperature"], strict=True)) == [PLANTED]
    assert framed["mean_difference"].item() == pytest.approx(0.1, abs=0.01)


def test_the_heatmap_writes_every_cell_and_frames_the_planted_one(differences):
    ax = plot_regime_map(differences, "trainer.lr", "trainer.temperature", metric="val/accuracy",
                         where={"alpha": 0.5})
    assert len(ax.texts) == len(LRS) * len(TEMPERATURES)
    bold = [text for text in ax.texts if text.get_fontweight() == "bold"]
    assert len(bold) == 1 and bold[0].get_position() == (TEMPERATURES.index(1.3), LRS.index(3e-4))
    assert len(ax.patches) == 1 and ax.patches[0].get_xy() == (TEMPERATURES.index(1.3) - 0.5, LRS.index(3e-4) - 0.5)
    assert [label.get_text() for label in ax.get_xticklabels()] == ["0.7", "1", "1.3"]
    # each cell states its pairs and MDE; the planted cell, the deepest colour, is written in white
    assert all(f"n = {len(SEEDS)}, MDE " in text.get_text() for text in ax.texts)
    assert bold[0].get_color() == "white"
    assert {text.get_color() for text in ax.texts if text is not bold[0]} == {"black"}


def test_a_map_without_picking_the_other_factor_is_refused_naming_it(differences):
    with pytest.raises(ValueError, match=r"several cells per \(trainer.lr, trainer.temperature\).*where=.*alpha"):
        regime_cells(differences, "trainer.lr", "trainer.temperature", metric="val/accuracy")
    with pytest.raises(ValueError, match=r"no column 'trainer.kl'"):
        regime_cells(differences, "trainer.lr", "trainer.kl", metric="val/accuracy")


def test_the_report_of_an_alpha_by_two_factor_sweep_draws_a_map_per_alpha(tmp_path):
    sweep_dir, runs = tmp_path / "regime", []
    summaries = synthetic_summaries()
    summaries = summaries[summaries["seed"] <= 3]
    for row in summaries.to_dict("records"):
        lr, temperature, alpha, seed = row["trainer.lr"], row["trainer.temperature"], row["alpha"], row["seed"]
        name = f"a{alpha:g}-lr{lr:g}-t{temperature:g}-s{seed}"
        write_fake_run(sweep_dir / name, metrics={keys.VAL_ACCURACY: [0.3, row["final_window"]]}, steps=[0, 10],
                       sweep="regime", run=name, alpha=alpha, seed=seed,
                       config={"seed": seed, "trainer": {"lr": lr, "temperature": temperature}},
                       axes={"alpha": alpha, "trainer.lr": lr, "trainer.temperature": temperature, "seed": seed})
        runs.append({"run": name, "state": "completed", "alpha": alpha, "seed": seed})
    (sweep_dir / "sweep.json").write_text(json.dumps({"sweep": "regime", "runs": runs, "grid": {
        "alpha": [0.0, 0.25, 0.5], "seed": [1, 2, 3], "eta": [],
        "axes": {"trainer.lr": list(LRS), "trainer.temperature": list(TEMPERATURES)}}}))
    report = build_report(sweep_dir).read_text()
    assert "### Regime map of val/accuracy at alpha = 0.25" in report
    assert "### Regime map of val/accuracy at alpha = 0.5" in report
    assert (sweep_dir / "report" / "fig_regime_val_accuracy_a0.5.png").is_file()
