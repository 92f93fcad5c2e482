#!/usr/bin/env bash
# Two training steps of the dataflex_sync trainer on one CUDA GPU with vLLM: checks that verl finds the trainer,
# that the mechanism runs on real batches and that its metrics reach verl's loggers. Not run in CI.
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

# 1. verl finds the trainer through the entry point alone.
"$PYTHON" -c "from verl.trainer.ppo.v1.trainer_base import get_trainer_cls; print(get_trainer_cls('dataflex_sync'))"

# 2. A small K&K data set: 3-person puzzles only, so short responses can be right.
"$PYTHON" -m dataflex_rl.tasks.prepare_verl --out "$WORK/data" --people 3 \
    --train-per-difficulty 64 --test-per-difficulty 16

# 3. Two steps, small batches, metrics to a JSON-lines file.
export VERL_FILE_LOGGER_PATH="$WORK/metrics.jsonl"
export WANDB_MODE=offline
"$PYTHON" -m dataflex_rl.verl.command verl_kk_3b \
    model="$MODEL" data_dir="$WORK/data" n_gpus_per_node=1 logger="[console,file]" \
    experiment_name=smoke dataflex.actuator.params.alpha=0.5 \
    data.train_batch_size=8 data.max_response_length=512 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
    trainer.default_local_dir="$WORK/checkpoints" \
    --run 2>&1 | tee "$WORK/train.log"

# 4. Every training step logged the mechanism's metrics, active from step 1 (warmup_step=0).
"$PYTHON" - "$VERL_FILE_LOGGER_PATH" <<'EOF'
import json
import sys

from dataflex_rl import keys

lines = [json.loads(line) for line in open(sys.argv[1])]
steps = [line for line in lines if keys.ACTIVE in line["data"]]
assert [line["step"] for line in steps] == [1, 2], f"steps with dataflex metrics: {[l['step'] for l in steps]}"
for line in steps:
    data = line["data"]
    assert data[keys.ACTIVE] == 1.0, data[keys.ACTIVE]
    assert abs(data[f"{keys.WEIGHT_PREFIX}/mean"] - 1.0) < 1e-3, data[f"{keys.WEIGHT_PREFIX}/mean"]
    assert data[keys.VALID_TOKENS] > 0
    assert any(key.startswith(keys.GRAD_BY_PROB_PREFIX) for key in data)
    assert "timing_s/mechanism" in data
print(f"smoke test passed: {len(steps)} steps with dataflex metrics in {sys.argv[1]}")
EOF
