"""The long-addition experiment learns under GRPO: 2 seeds, each from its own warm start, as
``make sweep EXPERIMENT=long_addition`` runs them (the full recipe; slow tier, about 5 minutes a run)."""

from __future__ import annotations

import pytest

from dataflex_rl import keys
from dataflex_rl.compose import compose_train_config
from dataflex_rl.tracking.run_store import read_metrics
from dataflex_rl.local.train import run


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_grpo_raises_greedy_accuracy_over_the_warm_start(tmp_path, seed):
    run_dir = tmp_path / f"s{seed}"
    assert run(compose_train_config(["experiment=long_addition", f"seed={seed}", f"sft.seed={seed}",
                                      f"run_dir={run_dir}", f"sft.cache_dir={tmp_path / 'sft'}",
                                      "logger.wandb.mode=disabled", "threads=1"])) == 0
    accuracy = read_metrics(run_dir).set_index("step")[keys.VAL_ACCURACY].dropna()
    final = accuracy.iloc[-5:].mean()  # the final window of the docs' table, steps 60 to 100
    assert final > accuracy.loc[0], accuracy.to_dict()
    assert read_metrics(run_dir)[keys.RESPONSE_LENGTH_MEAN].dropna().mean() >= 30  # it reasons before answering
