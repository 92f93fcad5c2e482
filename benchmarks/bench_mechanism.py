"""Mechanism: ``apply`` (eager, compiled, integer mask) against plain torch (target: at most 1.5x), and its share of a
training step at verl's batch size (docs/performance.md)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.common import Row, format_table, interleaved, min_median
from dataflex_rl import build_mechanism

REFERENCE_VOCAB, REFERENCE_WIDTH, REFERENCE_LAYERS = 512, 64, 2


def plain_reweight(advantages: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor,
                   alpha: float) -> torch.Tensor:
    """The reference: masked weights, mean-normalised over valid tokens, applied."""
    mask = response_mask.to(advantages.dtype)
    weights = (alpha * old_log_probs.exp() + (1 - alpha)) * mask
    return torch.where(response_mask, advantages * (weights / (weights.sum() / mask.sum())), advantages)


def reference_step(rows: int, length: int, device: torch.device) -> Callable[[], None]:
    """Forward and backward of the stand-in actor (docs/performance.md) on ``rows`` random sequences of ``length``."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(REFERENCE_VOCAB, (rows, length), generator=generator).to(device)
    layer = torch.nn.TransformerEncoderLayer(REFERENCE_WIDTH, nhead=4, dim_feedforward=4 * REFERENCE_WIDTH,
                                             batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(REFERENCE_VOCAB, REFERENCE_WIDTH),
                                torch.nn.TransformerEncoder(layer, REFERENCE_LAYERS, enable_nested_tensor=False),
                                torch.nn.Linear(REFERENCE_WIDTH, REFERENCE_VOCAB)).to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            log_probs = model(tokens).float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1))
        log_probs.mean().backward()
        model.zero_grad(set_to_none=True)
        synchronize(device)

    return step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_share(args: argparse.Namespace) -> list[Row]:
    """The mechanism's share of a step (docs/performance.md), one row per ``old_log_probs`` dtype."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ref_rows = args.ref_rows or (16 if device.type == "cuda" else 1)
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(args.length) < torch.randint(1, args.length + 1, (args.bs, 1), generator=generator)).long()
    fields = {"old_log_probs": -torch.rand(args.bs, args.length, generator=generator) * 5, "response_mask": mask,
              "advantages": torch.randn(args.bs, 1, generator=generator).expand(args.bs, args.length) * mask}
    fields = {name: value.to(device) for name, value in fields.items()}
    mechanism = build_mechanism({"actuator": {"name": "advantage_reweight", "params": {"alpha": args.alpha}}})
    sides = {"reference": reference_step(ref_rows, args.length, device)}
    for dtype in (torch.float32, torch.bfloat16):
        batch = {**fields, "old_log_probs": fields["old_log_probs"].to(dtype)}
        sides[str(dtype)] = lambda batch=batch: (mechanism.process(1, batch, histograms=True), synchronize(device))
    times = interleaved(sides, rounds=args.step_rounds, warmup=2)
    scale = args.bs / ref_rows
    reference = min_median([seconds * 1e3 * scale for seconds in times["reference"]])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        mechanism_ms = min_median([seconds * 1e3 for seconds in times[str(dtype)]])
        share = mechanism_ms[1] / reference[1]
        rows.append(Row("mechanism", f"process share of a step, ({args.bs}, {args.length}), old_log_probs "
                        f"{str(dtype).removeprefix('torch.')}, {name}", "ms", reference, mechanism_ms, ratio=share,
                        note=f"before: stand-in actor step ({ref_rows} row(s) x {scale:g}); share {share:.2%} "
                             f"(an upper bound)"))
    return rows


def main(argv=None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bs", type=int, default=512)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (runs default to 1)")
    parser.add_argument("--ref-rows", type=int, default=0,
                        help="rows of the stand-in actor step timed per round (default: 16 on CUDA, 1 on the CPU)")
    parser.add_argument("--step-rounds", type=int, default=5, help="rounds of the share-of-a-step comparison")
    parser.add_argument("--only-share", action="store_true", help="only the share of a step (no torch.compile)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    if not args.only_share:
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

        times = interleaved({"plain": lambda: plain_reweight(advantages, old_log_probs, response_mask, args.alpha),
                             "eager": lambda: eager.apply(1, fields), "compiled": lambda: compiled.apply(1, fields),
                             "compiled, int mask": lambda: compiled.apply(1, verl_fields)},
                            rounds=args.rounds, warmup=2)
        plain = min_median([seconds * 1e3 for seconds in times["plain"]])
        for name in ("eager", "compiled", "compiled, int mask"):
            after = min_median([seconds * 1e3 for seconds in times[name]])
            verdict = "OK" if after[1] / plain[1] <= 1.5 else "over target"
            rows.append(Row("mechanism", f"apply ({name}) vs the plain computation, ({args.bs}, {args.length}), "
                            f"{torch.get_num_threads()} thread(s)", "ms", plain, after,
                            note=f"target <= 1.5x: {verdict}" + (f"; compiling took {compile_s:.0f} s"
                                                                 if name == "compiled" else "")))
    rows += step_share(args)
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
