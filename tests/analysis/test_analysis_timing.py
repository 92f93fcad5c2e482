"""Where a sweep's time goes (analysis.timing): a hand-made sweep whose every stage is derived by hand."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest

from analysis.load import load_sweep
from analysis.statistics import minimum_detectable_effect
from analysis.timing import main as timing_main
from analysis.timing import time_split, tradeoff
from dataflex_rl import keys
from dataflex_rl.tracking import run_store
from tests.analysis.synthetic import write_fake_run

NAN = math.nan
T0 = pd.Timestamp("2026-01-01T00:00:00+00:00")


def iso(seconds: float) -> str:
    return (T0 + pd.Timedelta(seconds=seconds)).isoformat()


def write_sweep(tmp_path, *, sft_built_inside: bool = True):
    """Invocation 0-100 s; warm start 2-32 s (25 s of SFT in done.json); one run 32-52 s, one failed run. The runs
    record their warm start as a path relative to the folder holding ``runs/`` (``sft.cache_dir``'s default)."""
    sweep = tmp_path / "runs" / "timed"
    checkpoint = tmp_path / "sft" / "key"
    checkpoint.mkdir(parents=True)
    (checkpoint / "done.json").write_text(json.dumps({"seconds": 25.0, "steps": 10}))
    written = (T0 + pd.Timedelta(seconds=30 if sft_built_inside else -3600)).timestamp()
    os.utime(checkpoint / "done.json", (written, written))
    metrics = {  # steps 0, 1, 2: validation at 0 and 2
        keys.VAL_ACCURACY: [0.5, NAN, 0.6], keys.TIMING_VAL: [1.0, NAN, 1.0],
        keys.TIMING_STARTUP: [NAN, 5.0, NAN], keys.TIMING_STEP: [NAN, 3.0, 3.0],
        keys.TIMING_GEN: [NAN, 1.0, 1.0], keys.TIMING_UPDATE: [NAN, 1.0, 1.0],
        keys.TIMING_MECHANISM: [NAN, 0.25, 0.25], keys.TIMING_PROB_CHANGE: [NAN, 0.25, NAN],
        keys.TIMING_LOG: [NAN, 0.1, 0.1],
    }
    entries = []
    for name, state in (("a0-s1", run_store.COMPLETED), ("a0.5-s1", run_store.FAILED)):
        run_dir = write_fake_run(sweep / name, metrics=metrics, sweep="timed", run=name, seed=1, state=state,
                                 metrics_format="parquet" if state == run_store.COMPLETED else "jsonl",
                                 error=None if state == run_store.COMPLETED else "RuntimeError: boom")
        meta = json.loads((run_dir / "meta.json").read_text())
        meta["warm_start"] = {"checkpoint": "sft/key", "design": "per_seed", "sft_seed": 1}
        (run_dir / "meta.json").write_text(json.dumps(meta))
        entries.append({"run": name, "state": state, "alpha": 0.0, "seed": 1, "attempts": 1,
                        "start": iso(32), "end": iso(52), "wall_time_s": 20.0})
    record = {"sweep": "timed", "grid": {"alpha": [0.0, 0.5], "seed": [1]}, "jobs": 2, "runs": entries,
              "warm_starts": [{"run": "sft-seed1", "state": run_store.COMPLETED, "attempts": 1, "start": iso(2),
                               "end": iso(32), "wall_time_s": 30.0}],
              "invocations": [{"argv": [], "start": iso(0), "end": iso(100), "exit_code": 1}]}
    run_store.atomic_write_json(sweep / run_store.SWEEP_FILE, record)
    return sweep


def test_each_stage_is_the_hand_derived_sum(tmp_path):
    table, totals = time_split(load_sweep(write_sweep(tmp_path), histograms=False))
    seconds = dict(zip(table["stage"], table["seconds"]))
    assert seconds == pytest.approx({
        "warm start: process start-up and save": 30.0 - 25.0,
        "warm start: SFT training and its checks": 25.0,
        "run: process start-up (imports, config, warm-start load, loggers)": 5.0,
        "rollout (sampling)": 2.0,
        "reward, advantages, old log-probs": 6.0 - (2.0 + 2.0 + 0.75),  # step time outside its timed parts
        "mechanism and its statistics": 0.5 + 0.25,
        "update (loss, backward, optimizer)": 2.0,
        "evaluation (greedy validation)": 2.0,
        "logging (run store, W&B)": 0.2,
        "run: finish and launch": 20.0 - (6.0 + 2.0 + 0.2 + 5.0),
        # no process ran in 0-2 s and 52-100 s
        "driver alone, inside its invocation (the closing tables and report come after it)": 100.0 - 50.0,
    })
    assert totals == pytest.approx({"wall": 100.0, "slots": 200.0, "processes": 50.0, "left_out": 1})
    assert table["share"].sum() == pytest.approx(1.0)


def test_a_warm_start_found_in_the_cache_counts_no_training(tmp_path):
    table, _ = time_split(load_sweep(write_sweep(tmp_path, sft_built_inside=False), histograms=False))
    seconds = dict(zip(table["stage"], table["seconds"]))
    assert seconds["warm start: SFT training and its checks"] == 0.0
    assert seconds["warm start: process start-up and save"] == 30.0


def test_the_command_prints_the_table_and_names_what_it_left_out(tmp_path, capsys):
    assert timing_main([str(write_sweep(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "| warm start: SFT training and its checks | 25 | 25% |" in out
    assert "wall time 1.7 min with 2 run(s) at once: its processes used 25% of the 3.3 slot-minutes" in out
    assert "1 process(es) not counted" in out


def test_the_tradeoff_truncates_the_runs_at_each_evaluation_step_and_prices_the_sweep(tmp_path):
    """Two arms x 3 seeds, val/accuracy at steps 0, 10, 20, the baseline flat at 0.5; a final window of one
    evaluation: stopped at step 10 the per-seed differences are (0.1, 0.2, 0.3), at step 20 (0.1, 0.1, 0.5). With
    the default window of 5 every step's window holds step 0 (the warm start, the same in both arms): no row."""
    sweep = tmp_path / "trade"
    baseline = {1: [0.5, 0.5, 0.5], 2: [0.5, 0.5, 0.5], 3: [0.5, 0.5, 0.5]}
    arm = {1: [0.5, 0.6, 0.6], 2: [0.5, 0.7, 0.6], 3: [0.5, 0.8, 1.0]}
    entries = []
    for alpha, values in ((0.0, baseline), (0.5, arm)):
        for seed, curve in values.items():
            name = f"a{alpha}-s{seed}"
            write_fake_run(sweep / name, steps=[0, 10, 20], sweep="trade", run=name, alpha=alpha, seed=seed,
                           metrics={keys.VAL_ACCURACY: curve, keys.TIMING_VAL: [2.0, 2.0, 2.0],
                                    keys.TIMING_STEP: [NAN, 10.0, 10.0], keys.TIMING_STARTUP: [NAN, 4.0, NAN]})
            # wall: start-up 4 + steps 20 + validations 6 + finish 10 = 40
            entries.append({"run": name, "state": run_store.COMPLETED, "alpha": alpha, "seed": seed, "attempts": 1,
                            "start": iso(0), "end": iso(40), "wall_time_s": 40.0})
    run_store.atomic_write_json(sweep / run_store.SWEEP_FILE, {
        "sweep": "trade", "grid": {"alpha": [0.0, 0.5], "seed": [1, 2, 3]}, "jobs": 1, "runs": entries,
        "warm_starts": [], "invocations": [{"argv": [], "start": iso(0), "end": iso(60), "exit_code": 0}]})
    data = load_sweep(sweep, histograms=False)
    table, _ = time_split(data)
    assert tradeoff(data, table, seeds=(3, 6)).empty
    trade = tradeoff(data, table, seeds=(3, 6), final_window=1).set_index(["steps", "seeds"])
    at_10, at_20 = pd.Series([0.1, 0.2, 0.3]), pd.Series([0.1, 0.1, 0.5])
    for steps, differences in ((10, at_10), (20, at_20)):
        spread = differences.std(ddof=1)
        assert trade.loc[(steps, 3), "mde"] == pytest.approx(minimum_detectable_effect(spread, 3))
        assert trade.loc[(steps, 6), "mde"] == pytest.approx(minimum_detectable_effect(spread, 6))
        assert bool(trade.loc[(steps, 3), "measured"]) and not bool(trade.loc[(steps, 6), "measured"])
    # costs: a run's start-up and finish 4 + 10 = 14 s, a step 10 s, a validation 2 s; no warm start; the driver
    # alone 60 - 40 = 20 s; 2 arms, one at a time
    assert trade.loc[(10, 3), "minutes"] == pytest.approx((3 * 2 * (14 + 10 * 10 + 2 * 2)) / 60 + 20 / 60)
    assert trade.loc[(20, 6), "minutes"] == pytest.approx((6 * 2 * (14 + 20 * 10 + 3 * 2)) / 60 + 20 / 60)
