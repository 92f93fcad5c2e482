"""Local backend: the default step, each speed lever before/after, and the achieved GFLOP/s against this machine's
matmul rate (docs/performance.md)."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import Row, format_table, interleaved, min_median

BEFORE = ("hf", False)  # HF generate, HF forward over the padded batch: the trainer before its own decoder
AFTER = ("cached", True)  # the defaults: KV-cached sampler, packed forward


def build_trainer(run_dir: Path, overrides: list[str]):
    """The default run's trainer, built as ``dataflex_rl.local.train`` builds it (loggers entered by the caller)."""
    from dataflex_rl import build_mechanism
    from dataflex_rl.compose import compose_train_config
    from dataflex_rl.run_config import parse_train_config
    from dataflex_rl.tinylm.sft import warm_start
    from dataflex_rl.local.trainer import GRPOTrainer
    from dataflex_rl.tasks import build_task
    from dataflex_rl.tracking import RunIdentity, RunStore, build_loggers

    resolved = compose_train_config([f"run_dir={run_dir}", *overrides])
    config = parse_train_config(resolved)
    task = build_task(config.task.name, config.task.params)
    model, tokenizer, _ = warm_start(config.model, config.task, config.sft, task)
    identity = RunIdentity.for_config(resolved, sweep="bench", run="bench", backend="local", mechanism="reweight",
                                      alpha=float(config.dataflex.alpha or 0.0), seed=config.seed)
    loggers = build_loggers(config.logger, RunStore(run_dir), identity, resolved)
    trainer = GRPOTrainer(config, task, model, tokenizer, build_mechanism(config.dataflex), loggers,
                          run_dir / "checkpoints")
    return trainer, loggers


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """``(in, out)`` of every linear layer of the decoder layers (the LM head is counted apart)."""
    return [(module.in_features, module.out_features) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name != "lm_head"]


def step_flops(batch, shapes: list[tuple[int, int]], vocab: int, hidden: int) -> dict[str, float]:
    """FLOPs one step needs with each distinct prompt run once and no padding."""
    from dataflex_rl.tinylm.decoder import distinct_prompts

    per_token = 2 * sum(i * o for i, o in shapes)
    prompt_mask = batch.attention_mask[:, : batch.prompt_length]
    first, _ = distinct_prompts(batch.input_ids[:, : batch.prompt_length])
    tokens = float(prompt_mask[first].sum()) + float(batch.response_mask.sum())
    generated = float(batch.response_mask.sum())
    head = 2 * vocab * hidden
    rows = batch.input_ids.shape[0]
    return {"rollout": per_token * tokens + head * generated,
            "update": 3 * (per_token * (tokens - rows) + head * generated), "tokens": tokens - rows}


def matmul_rate(shapes: list[tuple[int, int]], tokens: int, repeats: int = 3) -> float:
    """GFLOP/s of single-thread ``torch.mm`` over the update's products of every linear layer (best of repeats)."""
    generator = torch.Generator().manual_seed(0)
    products = []
    for fan_in, fan_out in shapes:
        x = torch.randn(tokens, fan_in, generator=generator)
        weight = torch.randn(fan_out, fan_in, generator=generator)
        grad = torch.randn(tokens, fan_out, generator=generator)
        products += [(x, weight.t()), (grad, weight), (grad.t(), x)]
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in products)
    best = min(interleaved({"mm": lambda: [torch.mm(a, b) for a, b in products]}, rounds=repeats)["mm"])
    return flops / best / 1e9


def wandb_service_cpu() -> float:
    """CPU seconds used so far by this process's children (W&B's service process)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])  # user + system
    return total


class LeverBench:
    """One trainer whose levers are switched between steps."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.results: dict[str, list[float]] = {}
        self.step_number = 0
        # Every measured step runs the exact bucket gradients, as the step numbered exact_every would.
        every = trainer.config.stats.exact_every
        exact_pass = trainer.exact_bucket_gradients
        trainer.exact_bucket_gradients = lambda step, *args: exact_pass(every or step, *args)
        self.batch = None  # the last rollout's batch, whose token counts give the step's FLOPs
        rollout = trainer.rollout

        def keep_batch(step):
            result = rollout(step)
            self.batch = result.batch
            return result

        trainer.rollout = keep_batch

    def step(self, name: str, sampler: str, pack: bool, threads: int = 1, compiled: bool = False) -> None:
        """One training step (and its logging) with the given levers, recorded under ``name``."""
        from dataflex_rl import keys

        trainer = self.trainer
        trainer.sampler, trainer.pack, trainer.compile = sampler, pack, compiled
        torch.set_num_threads(threads)
        self.step_number += 1
        metrics = trainer.train_step(self.step_number)
        log_start = time.perf_counter()
        trainer.log(self.step_number, metrics)
        log_seconds = time.perf_counter() - log_start
        torch.set_num_threads(1)
        exact = metrics.get(keys.TIMING_EXACT_GRAD, 0.0)
        for part, value in (("plain", metrics[keys.TIMING_STEP] - exact), ("exact", exact),
                            ("rollout", metrics[keys.TIMING_GEN]), ("update", metrics[keys.TIMING_UPDATE]),
                            ("mechanism", metrics[keys.TIMING_MECHANISM]), ("log", log_seconds)):
            self.results.setdefault(f"{name}/{part}", []).append(value)

    def validate(self, sampler: str) -> None:
        self.trainer.sampler = sampler
        start = time.perf_counter()
        self.trainer.validate()
        self.results.setdefault(f"validate/{sampler}", []).append(time.perf_counter() - start)


def measure(rounds: int, steps_per_side: int, overrides: list[str]) -> dict:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-local-") as directory:
        trainer, loggers = build_trainer(Path(directory) / "run", overrides)
        bench = LeverBench(trainer)
        shapes = linear_shapes(trainer.model)
        vocab, hidden = trainer.model.config.vocab_size, trainer.model.config.hidden_size
        flops: list[dict[str, float]] = []
        rates: list[float] = []
        with loggers:
            sides = {"before": lambda: bench.step("before", *BEFORE),
                     "after": lambda: bench.step("after", *AFTER),
                     "sampler only": lambda: bench.step("sampler only", "cached", False),
                     "pack only": lambda: bench.step("pack only", "hf", True),
                     "after, 2 threads": lambda: bench.step("after, 2 threads", *AFTER, threads=2)}
            for side in sides.values():  # warm-up
                side()
            # The compiled update's first step compiles (or loads the persistent cache): its extra time, apart.
            start = time.perf_counter()
            bench.step("compiled", *AFTER, compiled=True)
            compile_s = time.perf_counter() - start - min(bench.results["after/plain"])
            sides["after, compiled update"] = lambda: bench.step("compiled", *AFTER, compiled=True)
            bench.results.clear()
            cpu_start, logged_start = wandb_service_cpu(), bench.step_number
            for index in range(rounds):
                for name in (list(sides) if index % 2 == 0 else list(sides)[::-1]):
                    for _ in range(steps_per_side):
                        sides[name]()
                    if name == "after":
                        flops.append(step_flops(bench.batch, shapes, vocab, hidden))
                for sampler in (("hf", "cached") if index % 2 == 0 else ("cached", "hf")):
                    bench.validate(sampler)
                rates.append(matmul_rate(shapes, int(flops[-1]["tokens"])))
            service_cpu = (wandb_service_cpu() - cpu_start) / max(bench.step_number - logged_start, 1)
    return {"results": bench.results, "flops": flops, "rates": rates, "service_cpu": service_cpu,
            "config": trainer.config, "compile_s": compile_s}


def amortised(config) -> dict[str, float]:
    """Validations and exact-gradient passes per step of a ``total_steps`` run at the config's schedule."""
    total = max(config.trainer.total_steps, 1)
    exact = total // config.stats.exact_every if config.stats.exact_every else 0
    return {"validate": config.trainer.evaluations / total, "exact": exact / total}


def default_steps(measured: dict, name: str, sampler: str) -> list[float]:
    """Per round: a plain step plus its share of validation, exact gradients and logging (W&B service included)."""
    results, share = measured["results"], amortised(measured["config"])
    count = len(results[f"{name}/plain"])
    per_round = count // len(results[f"validate/{sampler}"])
    validate = [value for value in results[f"validate/{sampler}"] for _ in range(per_round)]
    return [results[f"{name}/plain"][i] + share["exact"] * results[f"{name}/exact"][i] + results[f"{name}/log"][i]
            + share["validate"] * validate[i] + measured["service_cpu"] for i in range(count)]


def rows_from(measured: dict) -> list[Row]:
    results, config = measured["results"], measured["config"]
    before, after = default_steps(measured, "before", "hf"), default_steps(measured, "after", "cached")
    two_threads = default_steps(measured, "after, 2 threads", "cached")
    share = amortised(config)
    # Useful FLOPs of each round's step (validation and exact passes add a few percent; left out).
    useful = [f["rollout"] + f["update"] for f in measured["flops"]]
    per_round = len(after) // len(useful)
    rate = measured["rates"]

    def achieved(steps: list[float]) -> list[float]:
        return [useful[i // per_round] / seconds / 1e9 for i, seconds in enumerate(steps)]

    def of_rate(steps: list[float]) -> list[float]:
        return [value / rate[i // per_round] for i, value in enumerate(achieved(steps))]

    rows = [Row("local step", "default step (before: HF generate + padded HF forward)", "s", min_median(before),
                min_median(after), note="goal: >= 1.5x faster (ratio <= 0.67x)"),
            Row("local step", "rollout: sampler=hf -> cached", "s", min_median(results["before/rollout"]),
                min_median(results["sampler only/rollout"])),
            Row("local step", "update: pack=false -> true", "s", min_median(results["before/update"]),
                min_median(results["pack only/update"])),
            compile_row(results, measured["compile_s"], config.trainer.total_steps),
            Row("local step", "default step: 1 -> 2 threads (both levers on)", "s", min_median(after),
                min_median(two_threads), note="> 1x: one thread is faster"),
            Row("local step", "validation (256 greedy prompts): hf -> cached", "s",
                min_median(results["validate/hf"]), min_median(results["validate/cached"]),
                note=f"{share['validate']:.3f} per step"),
            Row("local step", "achieved GFLOP/s (useful FLOPs / default step)", "GFLOP/s", min_median(achieved(before)),
                min_median(achieved(after)), note=f"1-thread matmul on the model's shapes: "
                f"{min(rate):.1f} / {sorted(rate)[len(rate) // 2]:.1f} GFLOP/s"),
            Row("local step", "achieved share of that matmul rate (same round)", "", min_median(of_rate(before)),
                min_median(of_rate(after)), note="goal: >= 0.55")]
    step_total = sum(after)
    parts = {"rollout": sum(results["after/rollout"]), "update": sum(results["after/update"]),
             "mechanism + statistics": sum(results["after/mechanism"]),
             "exact gradients (amortised)": share["exact"] * sum(results["after/exact"]),
             "logging (main thread + W&B service)": sum(results["after/log"])
             + measured["service_cpu"] * len(after)}
    note = ", ".join(f"{name} {value / step_total:.1%}" for name, value in parts.items())
    rows.append(Row("local step", "shares of the default step", "s", None, min_median(after), note=note))
    return rows


def compile_row(results: dict[str, list[float]], compile_s: float, total_steps: int) -> Row:
    """The update, eager against ``trainer.compile=true``, and whether compiling pays within a default run."""
    eager, compiled = min_median(results["after/update"]), min_median(results["compiled/update"])
    # The smaller of the two estimates (from the minima, from the medians): a noisy round must not flip the verdict.
    saved = min(eager[0] - compiled[0], eager[1] - compiled[1]) * total_steps
    verdict = "pays" if saved > compile_s else "does not pay"
    return Row("local step", "update: eager -> trainer.compile=true", "s", eager, compiled,
               note=f"first step's compile/cache load {compile_s:.0f} s vs {saved:.0f} s saved over "
                    f"{total_steps} steps: {verdict}")


def main(argv=None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-side", type=int, default=1)
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override (repeatable)")
    args = parser.parse_args(argv)
    rows = rows_from(measure(args.rounds, args.steps_per_side, args.override))
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
