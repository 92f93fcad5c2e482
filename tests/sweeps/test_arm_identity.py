"""One identity per arm (issue: the record under hostile use, family 1): the driver, the run names, the growth of a
sweep and the analysis's baseline all take two factor values as one arm by ``tracking.identity.same_arm``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.aggregate import paired_differences, run_summaries
from analysis.load import ArmValueError, load_sweep
from dataflex_rl.tracking.identity import same_arm
from dataflex_rl.validation import ConfigError
from sweeps.sweep_config import parse_sweep_config
from sweeps.grid import expand_grid
from sweeps.manifest import Manifest, SweepMismatchError
from tests.analysis.synthetic import write_fake_run


def names(alpha: list[float], extra: tuple[str, ...] = ()) -> list[str]:
    return [spec.name for spec in expand_grid(parse_sweep_config({"alpha": alpha, "seeds": [1], "extra": extra}))]


def test_values_one_arm_apart_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"is not allowed beside"):
        names([1e-9, 0.5, 0.5000000001])  # the command of the issue
    with pytest.raises(ConfigError, match=r"alpha = 0.5000000001 is not allowed beside 0.5"):
        names([0.5, 0.5000000001])
    with pytest.raises(ConfigError, match=r"alpha = 1e-09 is not allowed beside 0.0.*baseline"):
        names([1e-9, 0.5])
    with pytest.raises(ConfigError, match=r"trainer.lr = '0.0001000001' is not allowed beside '0.0001'"):
        names([0.5], ("trainer.lr=1e-4,1.000001e-4",))
    assert names([0.5, 0.50002]) == ["a0.0-s1", "a0.5-s1", "a0.50002-s1"]  # 4e-5 apart: two arms


def test_minus_zero_is_the_baseline_and_a_grown_sweep_keeps_one_baseline_arm() -> None:
    assert names([-0.0]) == ["a0.0-s1"]
    assert names([-0.0, 0.5]) == names([0.5]) == ["a0.0-s1", "a0.5-s1"]
    assert same_arm(-0.0, 0.0) and same_arm("3e-05", 3e-05) and not same_arm("ar", "ar_paper")


def header(alpha: list[float], lr: list[str]) -> dict:
    return {"sweep": "grown", "backend": "local", "grid": {"alpha": alpha, "seed": [1], "axes": {"trainer.lr": lr}}}


def test_growing_a_sweep_by_a_value_one_arm_from_a_recorded_one_is_refused(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "grown"
    manifest = Manifest(sweep_dir, header([0.0, 0.5], ["0.0001"]))
    manifest.save()
    Manifest(sweep_dir, header([0.0, 0.5, 0.25], ["0.0001", "0.0003"]))  # new arms: accepted
    with pytest.raises(SweepMismatchError, match=r"alpha = 0.5000000001 is not allowed: sweep grown has the arm "
                                                 r"alpha = 0.5"):
        Manifest(sweep_dir, header([0.0, 0.5000000001], ["0.0001"]))
    with pytest.raises(SweepMismatchError, match=r"trainer.lr = '0.00010000001'"):
        Manifest(sweep_dir, header([0.0, 0.5], ["0.00010000001"]))


def write_pair(sweep_dir: Path, alphas: tuple[float, float]) -> None:
    for alpha in alphas:
        for seed in (1, 2, 3):
            write_fake_run(sweep_dir / f"a{alpha!r}-s{seed}", run=f"a{alpha!r}-s{seed}", metrics={"val/accuracy": np.full(4, 0.5 + seed / 100)},
                           alpha=alpha, seed=seed, sweep=sweep_dir.name)


def test_the_analysis_takes_a_minus_zero_run_as_the_baseline_and_refuses_two_values_of_one_arm(tmp_path) -> None:
    write_pair(tmp_path / "minus", (-0.0, 0.5))
    data = load_sweep(tmp_path / "minus")
    deltas = paired_differences(run_summaries(data.metrics, metrics=["val/accuracy"]), baseline={"alpha": 0.0})
    assert deltas["n_pairs"].tolist() == [3]
    write_pair(tmp_path / "close", (0.5, 0.5000000001))
    with pytest.raises(ArmValueError, match=r"record alpha = 0.5 and 0.5000000001: one arm"):
        load_sweep(tmp_path / "close")
