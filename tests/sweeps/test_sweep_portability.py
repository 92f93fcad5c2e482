"""Portability on one machine: the same short sweep under torch's default CPU kernels and under
``ATEN_CPU_CAPABILITY=avx2`` records each environment and reaches conclusions that agree within their intervals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from analysis import aggregate, load
from sweeps.cli import main

VARIABLE = "ATEN_CPU_CAPABILITY"
SHORT = ["alpha=0.5", "seeds=1,2,3", "steps=30", "jobs=2", "report=false",
         "extra=[sft.steps=300 trainer.val_size=256 trainer.val_every=10 logger.wandb.mode=disabled "
         "stats.exact_every=0 stats.prob_change_every=0]"]


def _sweep(tmp_path: Path, name: str) -> tuple[Path, object]:
    assert main([*SHORT, f"root={tmp_path / 'runs'}", f"name={name}"]) == 0
    sweep_dir = tmp_path / "runs" / name
    data = load.load_sweep(sweep_dir, histograms=False)
    summaries = aggregate.run_summaries(data.metrics, metrics=["val/accuracy"], final_window=2)
    means = aggregate.aggregate_runs(summaries, group_keys=("alpha",)).set_index("alpha")
    delta = aggregate.paired_differences(summaries, group_keys=("alpha",), baseline={"alpha": 0.0}).iloc[0]
    return sweep_dir, (means, delta)


def _capabilities(sweep_dir: Path) -> set[tuple[str, str | None]]:
    metas = [json.loads(path.read_text()) for path in sweep_dir.glob("a*/meta.json")]
    return {(meta["environment"]["cpu_capability"], meta["environment"]["aten_cpu_capability"]) for meta in metas}


def _overlap(low_a: float, high_a: float, low_b: float, high_b: float) -> bool:
    return low_a <= high_b and low_b <= high_a


@pytest.mark.slow
def test_default_and_avx2_kernels_give_conclusions_that_agree_within_their_intervals(tmp_path, monkeypatch):
    default = torch.backends.cpu.get_cpu_capability()
    if default not in ("AVX512", "AVX512_BF16", "AMX"):
        pytest.skip(f"torch's default kernels here are {default}: capping them at avx2 would change nothing")
    monkeypatch.chdir(tmp_path)  # each environment trains its own warm starts in ./.cache/sft (keyed by kernels)
    monkeypatch.delenv(VARIABLE, raising=False)
    native_dir, (native_means, native_delta) = _sweep(tmp_path, "native")
    monkeypatch.setenv(VARIABLE, "avx2")
    avx2_dir, (avx2_means, avx2_delta) = _sweep(tmp_path, "avx2")

    assert _capabilities(native_dir) == {(default, None)}
    assert _capabilities(avx2_dir) == {("AVX2", "avx2")}
    # the kernels change the numbers: the warm starts differ, so do the runs
    assert len(list((tmp_path / ".cache" / "sft").glob("*/done.json"))) == 6
    assert not native_means["mean"].equals(avx2_means["mean"])
    # ... and the conclusions agree: each arm's mean and the paired delta, within their intervals
    for alpha in (0.0, 0.5):
        a, b = native_means.loc[alpha], avx2_means.loc[alpha]
        assert _overlap(a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"]), (alpha, a, b)
    assert _overlap(native_delta["ci_low"], native_delta["ci_high"], avx2_delta["ci_low"], avx2_delta["ci_high"])
