"""SFT warm start: one SFT step (``sft_step``, the default batch and model, one thread) with the HF forward over the
padded batch against the packed forward pass the SFT uses, on each laptop task: the per-seed warm start's cost."""

from __future__ import annotations

import torch

from benchmarks.common import Row, interleaved, min_median, options, printed


def task_row(label: str, overrides: list[str], rounds: int) -> Row:
    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tinylm.model import build_model
    from dataflex_rl.tinylm.sft import sft_batch, sft_step, sft_step_seed

    config = parse_train_config(compose_train_config([*overrides, "run_dir=unused", "mode=sft"]))
    model, tokenizer = build_model(config.model, config.task.built.alphabet, seed=0)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.sft.lr)
    batch = sft_batch(tokenizer, config.task.built.train_problems(config.sft.batch_size, seed=sft_step_seed(0, 0)))
    times = interleaved({"padded": lambda: sft_step(model, optimizer, batch, False),
                         "packed": lambda: sft_step(model, optimizer, batch, True)}, rounds=rounds, warmup=2)
    return Row("sft", f"SFT step ({label}): padded -> packed", "s", min_median(times["padded"]),
               min_median(times["packed"]), note=f"{config.sft.batch_size} problems, 1 thread")


def main(argv: list[str] | None = None) -> list[Row]:
    rounds = options(__doc__, argv, rounds=20).rounds
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return printed([task_row("arithmetic", [], rounds), task_row("K&K", ["experiment=kk"], rounds)])
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
