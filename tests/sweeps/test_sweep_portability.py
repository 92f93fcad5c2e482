"""Portability on one machine: the same short sweep under torch's default CPU kernels and under
``ATEN_CPU_CAPABILITY=avx2`` records each environment and reaches conclusions that agree within their intervals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import aggregate, load, statistics
from sweeps.cli import main

VARIABLE = "ATEN_CPU_CAPABILITY"
# The default recipe (its 500-step SFT warm start per seed), shortened: 4 seeds x 40 RL steps, 512 validation items.
SHORT = ["alpha=0.5", "seeds=1,2,3,4", "steps=40", "jobs=2", "report=false",
         "extra=[trainer.val_size=512 trainer.val_every=10 logger.wandb.mode=disabled stats.exact_every=0 "
         "stats.prob_change_every=0]"]


def _finals(tmp_path: Path, name: str) -> tuple[Path, pd.DataFrame]:
    """The sweep's final-window val/accuracy, one row per seed, one column per alpha."""
    assert main([*SHORT, f"root={tmp_path / 'runs'}", f"name={name}"]) == 0
    sweep_dir = tmp_path / "runs" / name
    data = load.load_sweep(sweep_dir, histograms=False)
    summaries = aggregate.run_summaries(data.metrics, metrics=["val/accuracy"], final_window=2)
    return sweep_dir, summaries.pivot(index="seed", columns="alpha", values="final_window")


def _capabilities(sweep_dir: Path) -> set[tuple[str, str | None]]:
    metas = [json.loads(path.read_text()) for path in sweep_dir.glob("a*/meta.json")]
    return {(meta["environment"]["cpu_capability"], meta["environment"]["aten_cpu_capability"]) for meta in metas}


@pytest.mark.slow
def test_default_and_avx2_kernels_give_conclusions_that_agree_within_their_intervals(tmp_path, monkeypatch):
    default = torch.backends.cpu.get_cpu_capability()
    if default not in ("AVX512", "AVX512_BF16", "AMX"):
        pytest.skip(f"torch's default kernels here are {default}: capping them at avx2 would change nothing")
    monkeypatch.chdir(tmp_path)  # each environment trains its own warm starts in ./.cache/sft (keyed by kernels)
    monkeypatch.delenv(VARIABLE, raising=False)
    native_dir, native = _finals(tmp_path, "native")
    monkeypatch.setenv(VARIABLE, "avx2")
    avx2_dir, avx2 = _finals(tmp_path, "avx2")

    assert _capabilities(native_dir) == {(default, None)}
    assert _capabilities(avx2_dir) == {("AVX2", "avx2")}
    # the kernels change the numbers: the warm starts differ, so do the runs
    assert len(list((tmp_path / ".cache" / "sft").glob("*/done.json"))) == 8
    assert not np.allclose(native.to_numpy(), avx2.to_numpy())
    # ... and the conclusions agree: each arm's mean, and the AR-minus-baseline delta (per seed), do not differ
    # between the two environments by more than their spread over seeds allows (Welch's 95% interval holds 0)
    native_deltas, avx2_deltas = native[0.5] - native[0.0], avx2[0.5] - avx2[0.0]
    for what, x, y in ((0.0, native[0.0], avx2[0.0]), (0.5, native[0.5], avx2[0.5]),
                       ("delta", native_deltas, avx2_deltas)):
        between = statistics.welch_t(x.to_numpy(), y.to_numpy())
        assert between["ci_low"] <= 0.0 <= between["ci_high"], (what, x.tolist(), y.tolist(), between)
