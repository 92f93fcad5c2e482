"""Local backend: where a training step's time goes, and rollout throughput against bare ``model.generate``.

Targets (issue: local backend): mechanism plus its statistics <= 2% of a step, logging <= 1% of a step, rollout
tokens/s >= 0.95x of bare ``model.generate`` on the same model and batch. Everything is measured in this process,
side by side; the step shares come from a short real run of the default trainer config (32 prompts x 8 rollouts).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def step_shares(steps: int, threads: int) -> dict[str, float]:
    from hydra import compose, initialize_config_dir

    from dataflex_rl import keys
    from dataflex_rl.tracking import load_metrics
    from dataflex_rl.train import CONF_DIR, run

    with tempfile.TemporaryDirectory() as directory:
        run_dir = Path(directory) / "run"
        overrides = [f"run_dir={run_dir}", "sft.steps=0", f"trainer.total_steps={steps}", "trainer.val_every=0",
                     "trainer.val_size=32", "trainer.save_every=0", "stats.exact_every=0",
                     "logger.wandb.mode=offline", "logger.hist_every=10", f"threads={threads}"]
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides)
        if run(cfg) != 0:
            raise RuntimeError("benchmark run failed")
        frame = load_metrics(run_dir)
    frame = frame[frame.step >= 2]  # the first step pays one-off warm-up costs
    step = frame[keys.TIMING_STEP].sum()
    return {
        "step_s": float(frame[keys.TIMING_STEP].mean()),
        "mechanism_share": float(frame[keys.TIMING_MECHANISM].sum() / step),
        "log_share": float(frame[keys.TIMING_LOG].sum() / step),
        "gen_share": float(frame[keys.TIMING_GEN].sum() / step),
        "update_share": float(frame[keys.TIMING_UPDATE].sum() / step),
    }


def rollout_ratio(repeats: int, threads: int) -> dict[str, float]:
    from dataflex_rl.local.config import ModelConfig
    from dataflex_rl.local.model import build_model
    from dataflex_rl.local.sequences import encode_prompts, generate
    from dataflex_rl.tasks import build_task

    torch.set_num_threads(threads)
    task = build_task("arithmetic", {})
    model, tokenizer = build_model(ModelConfig(), task.alphabet, seed=0)
    model.eval()
    prompts = [problem.prompt for problem in task.train_problems(32, seed=0)]
    max_new = task.max_completion_chars + 2
    ids, mask = encode_prompts(tokenizer, prompts)
    ids, mask = ids.repeat_interleave(8, 0), mask.repeat_interleave(8, 0)

    def ours() -> int:
        torch.manual_seed(0)
        return int(generate(model, tokenizer, prompts, 8, max_new, 1.0).response_mask.sum())

    def bare() -> int:
        torch.manual_seed(0)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
        responses = out[:, ids.shape[1]:]
        return int(((responses == tokenizer.eos_token_id).long().cumsum(1) - (responses == tokenizer.eos_token_id).long()
                    == 0).sum())

    rates: dict[str, list[float]] = {"ours": [], "bare": []}
    ours(), bare()
    for _ in range(repeats):  # interleaved, so noise hits both alike
        for name, function in (("bare", bare), ("ours", ours)):
            start = time.perf_counter()
            tokens = function()
            rates[name].append(tokens / (time.perf_counter() - start))
    ours_rate, bare_rate = statistics.median(rates["ours"]), statistics.median(rates["bare"])
    return {"ours_tokens_per_s": ours_rate, "bare_tokens_per_s": bare_rate, "ratio": ours_rate / bare_rate}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    shares = step_shares(args.steps, args.threads)
    print(f"local training step (32 prompts x 8 rollouts, {args.threads} threads): {shares['step_s'] * 1e3:.0f} ms/step")
    print(f"  rollout {shares['gen_share']:6.1%}   update {shares['update_share']:6.1%}")
    print(f"  mechanism + statistics {shares['mechanism_share']:6.2%} of a step (target <= 2%: "
          f"{'OK' if shares['mechanism_share'] <= 0.02 else 'over target'})")
    print(f"  logging                {shares['log_share']:6.2%} of a step (target <= 1%: "
          f"{'OK' if shares['log_share'] <= 0.01 else 'over target'})")
    rollout = rollout_ratio(args.repeats, args.threads)
    print(f"rollout throughput: ours {rollout['ours_tokens_per_s']:.0f} tokens/s, bare model.generate "
          f"{rollout['bare_tokens_per_s']:.0f} tokens/s, ratio {rollout['ratio']:.3f}x (target >= 0.95x: "
          f"{'OK' if rollout['ratio'] >= 0.95 else 'under target'})")
    return {**shares, **rollout}


if __name__ == "__main__":
    main()
