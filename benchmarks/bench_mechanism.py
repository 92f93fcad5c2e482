"""Mechanism overhead: ``mech.apply`` against the bare expression, side by side in one process.

Target (issue: foundation): at most 1.5x for (bs, L) = (512, 4096) float32 on the CPU; the extra is the mean
normalisation and the metrics.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dataflex_rl import build_mechanism


def time_call(function, repeats: int) -> float:
    function()  # warm up allocator and kernels
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bs", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--alpha", type=float, default=0.5)
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    old_log_probs = -torch.rand(args.bs, args.length, generator=generator) * 5
    response_mask = torch.rand(args.bs, args.length, generator=generator) > 0.1
    advantages = torch.randn(args.bs, args.length, generator=generator)
    fields = {"old_log_probs": old_log_probs, "response_mask": response_mask, "advantages": advantages}
    alpha = args.alpha
    block = {"actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}}}
    eager = build_mechanism(block)
    compiled = build_mechanism(block, compile=True)
    compile_start = time.perf_counter()
    compiled.apply(1, fields)
    compile_s = time.perf_counter() - compile_start

    # Interleave the measurements so machine noise hits all alike; keep each one's best round.
    # verl hands the response mask over as integers (a slice of the attention mask); the local trainer as bools.
    verl_fields = {**fields, "response_mask": response_mask.long()}
    compiled.apply(1, verl_fields)
    rounds: dict[str, list[float]] = {"bare": [], "eager": [], "compiled": [], "compiled, int mask": []}
    for _ in range(3):
        rounds["bare"].append(time_call(lambda: advantages * (alpha * old_log_probs.exp() + 1 - alpha), args.repeats))
        rounds["eager"].append(time_call(lambda: eager.apply(1, fields), args.repeats))
        rounds["compiled"].append(time_call(lambda: compiled.apply(1, fields), args.repeats))
        rounds["compiled, int mask"].append(time_call(lambda: compiled.apply(1, verl_fields), args.repeats))
    best = {name: min(values) for name, values in rounds.items()}
    print(f"mechanism apply, ({args.bs}, {args.length}) float32, {torch.get_num_threads()} threads, metrics included:")
    print(f"  bare expression                 {best['bare'] * 1e3:8.2f} ms")
    results = {"bare_s": best["bare"], "compile_s": compile_s}
    for name in ("eager", "compiled", "compiled, int mask"):
        ratio = best[name] / best["bare"]
        results[f"{name}_ratio"] = ratio
        verdict = "OK" if ratio <= 1.5 else "over target"
        print(f"  mech.apply ({name:18s}) {best[name] * 1e3:8.2f} ms  ratio {ratio:5.2f}x "
              f"(target <= 1.5x: {verdict})")
    print(f"  first compiled call (compilation) {compile_s:6.1f} s")
    return results


if __name__ == "__main__":
    main()
