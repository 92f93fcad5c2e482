"""Mechanism overhead: ``mech.apply`` against the same computation written plainly, side by side in one process.

The reference does all the work ``apply`` must do for advantage reweighting, in eager torch: mask the weights
``w = alpha * exp(old_log_prob) + 1 - alpha``, divide by their mean over valid tokens, multiply the advantages
(masked positions pass through).
``apply`` also computes its metrics (token-probability and weight statistics); that is its overhead. Held fixed:
the batch ``(bs, L)`` float32, alpha, the thread count. Target: at most 1.5x of the reference.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import Row, format_table, interleaved, min_median
from dataflex_rl import build_mechanism


def plain_reweight(advantages: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor,
                   alpha: float) -> torch.Tensor:
    """The reference: masked weights, mean-normalised over valid tokens, applied (masked positions pass through,
    as ``apply`` leaves them)."""
    mask = response_mask.to(advantages.dtype)
    weights = (alpha * old_log_probs.exp() + (1 - alpha)) * mask
    return torch.where(response_mask, advantages * (weights / (weights.sum() / mask.sum())), advantages)


def main(argv=None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bs", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (runs default to 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    generator = torch.Generator().manual_seed(0)
    old_log_probs = -torch.rand(args.bs, args.length, generator=generator) * 5
    response_mask = torch.rand(args.bs, args.length, generator=generator) > 0.1
    advantages = torch.randn(args.bs, args.length, generator=generator)
    fields = {"old_log_probs": old_log_probs, "response_mask": response_mask, "advantages": advantages}
    # verl hands the response mask over as integers (a slice of the attention mask); the local trainer as bools.
    verl_fields = {**fields, "response_mask": response_mask.long()}
    block = {"actuator": {"name": "advantage_reweight", "params": {"alpha": args.alpha}}}
    eager = build_mechanism(block)
    compiled = build_mechanism(block, compile=True)
    compile_start = time.perf_counter()
    compiled.apply(1, fields)
    compile_s = time.perf_counter() - compile_start
    reference = plain_reweight(advantages, old_log_probs, response_mask, args.alpha)
    torch.testing.assert_close(eager.apply(1, fields)[0], reference)  # the same computation

    times = interleaved({
        "plain": lambda: plain_reweight(advantages, old_log_probs, response_mask, args.alpha),
        "eager": lambda: eager.apply(1, fields),
        "compiled": lambda: compiled.apply(1, fields),
        "compiled, int mask": lambda: compiled.apply(1, verl_fields),
    }, rounds=args.rounds, warmup=2)
    plain = min_median([seconds * 1e3 for seconds in times["plain"]])
    rows = []
    for name in ("eager", "compiled", "compiled, int mask"):
        after = min_median([seconds * 1e3 for seconds in times[name]])
        verdict = "OK" if after[1] / plain[1] <= 1.5 else "over target"
        rows.append(Row("mechanism", f"apply ({name}) vs the plain computation, ({args.bs}, {args.length}), "
                        f"{torch.get_num_threads()} thread(s)", "ms", plain, after,
                        note=f"target <= 1.5x: {verdict}" + (f"; compiling took {compile_s:.0f} s"
                                                             if name == "compiled" else "")))
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
