#!/usr/bin/env bash
# Two training steps of the dataflex_sync trainer with AR and two with Lopti, and two of AR through the policy-loss
# route in verl's V0 trainer, on one CUDA GPU with vLLM: checks that the environment is ready (the doctor), that
# verl finds the trainer and the loss, that the mechanism runs on real batches, that its metrics (and Lopti's
# per-stage actor metrics) reach verl's loggers, and that each run wrote a completed run store the analysis reads.
# Not run in CI.
#
#   scripts/verl_smoke.sh /models/Qwen2.5-0.5B-Instruct [WORK_DIR]
#
# Needs: this project and verl 0.9.1 with vLLM installed (see docs/verl.md), one CUDA GPU, a local model folder
# (nothing is downloaded). Exit status 0 when every check passed.
set -euo pipefail

MODEL=${1:?usage: scripts/verl_smoke.sh MODEL_DIR [WORK_DIR]}
WORK=${2:-$(mktemp -d -t dataflex-verl-smoke-XXXXXX)}
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
echo "work dir: $WORK"

# 1. The doctor: versions, the plugin's import (with its traceback), the entry point in a fresh process, and the
#    Lopti command below validated before any GPU work.
"$PYTHON" -m dataflex_rl.verl.check verl_kk_3b model="$MODEL" data_dir="$WORK/data" n_gpus_per_node=1 \
    dataflex.mechanism=isolate dataflex.actuator.name=lopti dataflex.actuator.params.alpha=0.0

# 2. A small K&K data set: 3-person puzzles only, so short responses can be right.
"$PYTHON" -m dataflex_rl.verl.data --out "$WORK/data" --task knights_knaves --train-size 64 --test-size 16 \
    num_people=3

# 3. Two steps per mechanism, small batches, metrics to JSON-lines files and to the run store.
export WANDB_MODE=offline
run_two_steps() {  # NAME, then dataflex overrides
    local name=$1
    shift
    VERL_FILE_LOGGER_PATH="$WORK/$name.metrics.jsonl" "$PYTHON" -m dataflex_rl.verl.command verl_kk_3b \
        model="$MODEL" data_dir="$WORK/data" n_gpus_per_node=1 logger="[console,file]" \
        experiment_name="smoke-$name" "$@" \
        data.train_batch_size=8 data.max_response_length=512 \
        actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
        actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
        trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
        trainer.default_local_dir="$WORK/checkpoints/$name" \
        +dataflex_run.dir="$WORK/runs/smoke/$name" +dataflex_run.sweep=smoke +dataflex_run.name="$name" \
        +dataflex_run.seed=1 +dataflex_run.mechanism_label="$name" \
        --run 2>&1 | tee "$WORK/$name.log"
}
run_two_steps ar dataflex.actuator.params.alpha=0.5
run_two_steps lopti dataflex.mechanism=isolate dataflex.actuator.name=lopti dataflex.actuator.params.alpha=0.0 \
    dataflex.actuator.params.eta=0.5
run_two_steps route dataflex.actuator.params.alpha=0.5 trainer_mode=v0  # the policy-loss route, verl's V0 trainer

# 4. Every training step logged the mechanism's metrics, active from step 1 (warmup_step=0); Lopti ran two actor
#    updates per step with per-stage metrics; the three run stores are completed and load.
"$PYTHON" - "$WORK" <<'PYEOF'
import json
import sys
from pathlib import Path

from analysis.load import load_sweep
from dataflex_rl import keys

work = Path(sys.argv[1])
for name in ("ar", "lopti"):
    lines = [json.loads(line) for line in open(work / f"{name}.metrics.jsonl")]
    steps = [line for line in lines if keys.ACTIVE in line["data"]]
    assert [line["step"] for line in steps] == [1, 2], f"{name}: steps with dataflex metrics: {[l['step'] for l in steps]}"
    for line in steps:
        data = line["data"]
        assert data[keys.ACTIVE] == 1.0, data[keys.ACTIVE]
        assert abs(data[f"{keys.WEIGHT_PREFIX}/mean"] - 1.0) < 1e-3, data[f"{keys.WEIGHT_PREFIX}/mean"]
        assert data[keys.VALID_TOKENS] > 0
        assert any(key.startswith(keys.GRAD_BY_PROB_PREFIX) for key in data)
        assert "timing_s/mechanism" in data
        if name == "lopti":
            assert data[keys.UPDATE_STAGES] == 2.0, data[keys.UPDATE_STAGES]
            for stage in (0, 1):
                assert keys.stage_metric(stage, keys.PG_LOSS) in data and keys.stage_metric(stage, keys.KL_LOSS) in data
            assert 0.0 <= data[keys.LOPTI_LOW_TOKEN_FRAC] <= 1.0
data = load_sweep(work / "runs" / "smoke")
assert len(data.included_runs) == 3, data.runs[["run", "state", "exclusion_reason"]]
assert set(data.included_runs["backend"]) == {"verl"}
assert set(data.metrics["step"]) >= {1, 2}
# The route's run store (written by dataflex_rl.verl.record from verl's file logger): AR's weights off 1 in the loss.
route = data.metrics[(data.metrics["run"] == "route") & (data.metrics["metric"] == f"{keys.WEIGHT_PREFIX}/std")]
assert sorted(route["step"]) == [1, 2] and (route["value"] > 0).all(), route
print("smoke test passed: AR, Lopti and the policy-loss route, 2 steps each, with dataflex metrics and run stores")
PYEOF
