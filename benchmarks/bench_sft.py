"""SFT warm start: one SFT step (``sft_step``, the default batch and model, one thread) with the HF forward over the
padded batch against the packed forward pass the SFT uses, on each laptop task: the per-seed warm start's cost."""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import Row, interleaved, min_median


def _task_rows(label: str, overrides: list[str], rounds: int) -> list[Row]:
    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tinylm.model import build_model
    from dataflex_rl.tinylm.sft import sft_batch, sft_step, sft_step_seed

    config = parse_train_config(compose_train_config([*overrides, "run_dir=unused", "mode=sft"]))
    task = config.task.built
    model, tokenizer = build_model(config.model, task.alphabet, seed=0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.sft.lr)
    batch = sft_batch(tokenizer, task.train_problems(config.sft.batch_size, seed=sft_step_seed(0, 0)))
    times = interleaved({"padded": lambda: sft_step(model, optimizer, batch, False),
                         "packed": lambda: sft_step(model, optimizer, batch, True)}, rounds=rounds, warmup=2)
    before, after = min_median(times["padded"]), min_median(times["packed"])
    print(f"{label}: SFT step padded {before[1]:.3f} s, packed {after[1]:.3f} s (median of {rounds})", flush=True)
    return [Row("sft", f"SFT step ({label}): padded -> packed", "s", before, after,
                note=f"{config.sft.batch_size} problems, 1 thread")]


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    options = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [*_task_rows("arithmetic", [], options.rounds), *_task_rows("K&K", ["experiment=kk"], options.rounds)]
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    from benchmarks.common import format_table

    print(format_table(main()))
