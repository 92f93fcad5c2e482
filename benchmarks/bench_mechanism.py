"""Mechanism: ``apply`` (eager, compiled, integer mask) against plain torch (target: at most 1.5x), and its share of a
training step at verl's batch size (what it holds fixed: docs/performance.md)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from benchmarks.common import Row, interleaved, min_median, options, printed
from dataflex_rl import build_mechanism

REFERENCE_VOCAB, REFERENCE_WIDTH, REFERENCE_LAYERS = 512, 64, 2


def plain_reweight(advantages: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor,
                   alpha: float) -> torch.Tensor:
    """The reference: masked weights, mean-normalised over valid tokens, applied."""
    mask = response_mask.to(advantages.dtype)
    weights = (alpha * old_log_probs.exp() + (1 - alpha)) * mask
    return torch.where(response_mask, advantages * (weights / (weights.sum() / mask.sum())), advantages)


def apply_rows(args: argparse.Namespace) -> list[Row]:
    """``apply`` eager, compiled and compiled on verl's integer mask against :func:`plain_reweight`."""
    generator = torch.Generator().manual_seed(0)
    fields = {"old_log_probs": -torch.rand(args.bs, args.length, generator=generator) * 5,
              "response_mask": torch.rand(args.bs, args.length, generator=generator) > 0.1,
              "advantages": torch.randn(args.bs, args.length, generator=generator)}
    # verl hands the response mask over as integers (a slice of the attention mask); the local trainer as bools.
    verl_fields = {**fields, "response_mask": fields["response_mask"].long()}
    block = {"actuator": {"name": "advantage_reweight", "params": {"alpha": args.alpha}}}
    eager, compiled = build_mechanism(block), build_mechanism(block, compile=True)
    start = time.perf_counter()
    compiled.apply(1, fields)
    compile_s = time.perf_counter() - start

    def plain() -> torch.Tensor:
        return plain_reweight(fields["advantages"], fields["old_log_probs"], fields["response_mask"], args.alpha)

    torch.testing.assert_close(eager.apply(1, fields)[0], plain())  # the same computation
    times = interleaved({"plain": plain, "eager": lambda: eager.apply(1, fields),
                         "compiled": lambda: compiled.apply(1, fields),
                         "compiled, int mask": lambda: compiled.apply(1, verl_fields)}, rounds=args.rounds, warmup=2)
    rows = []
    for name in ("eager", "compiled", "compiled, int mask"):
        after = min_median(times[name], 1e3)
        verdict = "OK" if after[1] / min_median(times["plain"], 1e3)[1] <= 1.5 else "over target"
        rows.append(Row("mechanism", f"apply ({name}) vs the plain computation, ({args.bs}, {args.length}), "
                        f"{torch.get_num_threads()} thread(s)", "ms", min_median(times["plain"], 1e3), after,
                        note=f"target <= 1.5x: {verdict}" + (f"; compiling took {compile_s:.0f} s"
                                                             if name == "compiled" else "")))
    return rows


def reference_step(rows: int, length: int, device: torch.device, synchronize: Callable[[], None]) -> Callable[[], None]:
    """Forward and backward of the stand-in actor (embedding, 2 encoder layers of width 64, a 512-token LM head, the
    log-probs of the given tokens; bfloat16 autocast on CUDA) on ``rows`` random sequences of ``length``."""
    tokens = torch.randint(REFERENCE_VOCAB, (rows, length), generator=torch.Generator().manual_seed(1)).to(device)
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
        synchronize()

    return step


def share_rows(args: argparse.Namespace) -> list[Row]:
    """``process`` (histograms on, as verl's trainer calls it once per step) on a verl-like batch against
    :func:`reference_step` on ``ref_rows`` rows, scaled to ``bs`` rows; one row per ``old_log_probs`` dtype."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ref_rows = args.ref_rows or (16 if device.type == "cuda" else 1)
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(args.length) < torch.randint(1, args.length + 1, (args.bs, 1), generator=generator)).long()
    fields = {"old_log_probs": -torch.rand(args.bs, args.length, generator=generator) * 5, "response_mask": mask,
              "advantages": torch.randn(args.bs, 1, generator=generator).expand(args.bs, args.length) * mask}
    fields = {name: value.to(device) for name, value in fields.items()}
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    mechanism = build_mechanism({"actuator": {"name": "advantage_reweight", "params": {"alpha": args.alpha}}})
    dtypes = (torch.float32, torch.bfloat16)
    sides = {str(dtype): lambda batch={**fields, "old_log_probs": fields["old_log_probs"].to(dtype)}: (
        mechanism.process(1, batch, histograms=True), synchronize()) for dtype in dtypes}
    times = interleaved({"reference": reference_step(ref_rows, args.length, device, synchronize), **sides},
                        rounds=args.step_rounds, warmup=2)
    reference, scale = min_median(times["reference"], 1e3 * args.bs / ref_rows), args.bs / ref_rows
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    rows = []
    for dtype in dtypes:
        mechanism_ms = min_median(times[str(dtype)], 1e3)
        share = mechanism_ms[1] / reference[1]
        rows.append(Row("mechanism", f"process share of a step, ({args.bs}, {args.length}), old_log_probs "
                        f"{str(dtype).removeprefix('torch.')}, {where}", "ms", reference, mechanism_ms, ratio=share,
                        note=f"before: stand-in actor step ({ref_rows} row(s) x {scale:g}); share {share:.2%} "
                             f"(an upper bound)"))
    return rows


def main(argv=None) -> list[Row]:
    args = options(__doc__, argv, bs=512, length=4096, rounds=15, alpha=0.5,
                   threads=(1, "torch threads (runs default to 1)"),
                   ref_rows=(0, "rows of the stand-in actor step timed per round (default: 16 on CUDA, 1 on the CPU)"),
                   step_rounds=(5, "rounds of the share-of-a-step comparison"),
                   only_share=(False, "only the share of a step (no torch.compile)"))
    torch.set_num_threads(args.threads)
    return printed([*([] if args.only_share else apply_rows(args)), *share_rows(args)])


if __name__ == "__main__":
    main()
