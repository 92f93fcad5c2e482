"""What a sweep's intervals cover: the design sentence and the warm-start table, from each run's recorded warm start."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analysis import load, report, warm_starts
from tests.analysis.synthetic import write_fake_run
from dataflex_rl.tracking import run_store


def _sweep(tmp_path: Path, design: str, after_sft: dict[int, float]) -> Path:
    """alpha 0 and 0.5 x the seeds of ``after_sft``; each seed's runs start at its step-0 accuracy, from warm start
    ``key<seed>`` (per_seed) or ``key0`` (shared)."""
    sweep = tmp_path / f"sweep-{design}"
    for seed, start in after_sft.items():
        for alpha in (0.0, 0.5):
            run_dir = write_fake_run(sweep / f"a{alpha:g}-s{seed}", sweep=sweep.name, alpha=alpha, seed=seed,
                                     steps=[0, 10, 20], metrics={"val/accuracy": [start, start + 0.1, start + 0.2]},
                                     config={"trainer": {"val_size": 64}})
            sft_seed = seed if design == "per_seed" else 0
            meta = run_store.read_meta(run_dir)
            meta["warm_start"] = {"design": design, "checkpoint": f"/cache/sft/key{sft_seed}", "sft_seed": sft_seed}
            run_store.atomic_write_json(run_dir / run_store.META_FILE, meta)
    return sweep


def test_per_seed_design_sentence_and_table_give_each_warm_start_and_their_spread(tmp_path):
    data = load.load_sweep(_sweep(tmp_path, "per_seed", {1: 0.3, 2: 0.7}), histograms=False)
    table = warm_starts.warm_start_table(data)
    assert list(table["warm start"]) == ["key1", "key2"] and list(table["sft.seed"]) == [1, 2]
    assert list(table["runs"]) == [2, 2] and list(table["seeds"]) == ["1", "2"]
    assert table["val/accuracy after SFT"].tolist() == pytest.approx([0.3, 0.7])
    sentence = warm_starts.design_sentence(data)
    spread = math.sqrt(((0.3 - 0.5) ** 2 + (0.7 - 0.5) ** 2) / 1)  # sample SD of {0.3, 0.7}: 0.283
    assert sentence.startswith("Design: each seed its own SFT warm start (warm_start=per_seed: 2 warm starts, "
                               "sft.seed = the seed, the same for every arm of a seed; val/accuracy after SFT 0.300 "
                               f"to 0.700, SD {spread:.3f}).")
    assert "include the RL seed and the warm start's draw" in sentence
    assert "every run is scored on the same 64 held-out problems" in sentence


def test_a_shared_warm_start_is_named_and_the_result_said_to_hold_for_it_only(tmp_path):
    data = load.load_sweep(_sweep(tmp_path, "shared", {1: 0.4, 2: 0.4, 3: 0.4}), histograms=False)
    assert len(warm_starts.warm_start_table(data)) == 1
    sentence = warm_starts.design_sentence(data)
    assert sentence.startswith("Design: one SFT warm start shared by every run (warm_start=shared: sft.seed = 0; "
                               "val/accuracy after SFT 0.400).")
    assert "the result holds for this warm start only" in sentence and "RL seed only" in sentence


def test_runs_without_a_recorded_warm_start_say_so(tmp_path):
    sweep = tmp_path / "sweep-none"
    write_fake_run(sweep / "a0-s1", sweep=sweep.name, alpha=0.0, seed=1, steps=[0, 10],
                   metrics={"val/accuracy": [0.1, 0.2]})
    data = load.load_sweep(sweep, histograms=False)
    assert warm_starts.warm_start_table(data).empty
    assert warm_starts.design_sentence(data).startswith("Design: not recorded (the runs record no warm start).")


def test_the_report_states_the_design_under_its_summary_and_lists_the_warm_starts(tmp_path):
    sweep = _sweep(tmp_path, "per_seed", {1: 0.3, 2: 0.7, 3: 0.5})
    assert report.main([str(sweep), "--bootstrap", "200"]) == 0
    text = (sweep / "report" / "report.md").read_text()
    summary = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "Design: each seed its own SFT warm start (warm_start=per_seed: 3 warm starts" in summary
    section = text.split("## Warm starts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    assert [row.split("|")[1].strip() for row in rows] == ["key1", "key2", "key3"]
