"""Local backend: the default step, each speed lever before/after, the achieved GFLOP/s against this machine's matmul
rate, and the cost of evaluation: validations of N items against a training step and their share of a run (what it
holds fixed: docs/performance.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import Row, build_trainer, interleaved, min_median, options, printed
from dataflex_rl import keys

# side -> (sampler, pack, threads, compiled update). "before" is the trainer before its own decoder (HF generate, HF
# forward over the padded batch), "after" its defaults (the KV-cached sampler, the packed forward).
SIDES = {"before": ("hf", False, 1, False), "after": ("cached", True, 1, False),
         "sampler only": ("cached", False, 1, False), "pack only": ("hf", True, 1, False),
         "after, 2 threads": ("cached", True, 2, False), "compiled": ("cached", True, 1, True)}
PARTS = {"rollout": keys.TIMING_GEN, "update": keys.TIMING_UPDATE, "mechanism": keys.TIMING_MECHANISM}


def step_flops(batch, shapes: list[tuple[int, int]], vocab: int, hidden: int) -> dict[str, float]:
    """FLOPs one step needs with each distinct prompt run once and no padding (linear layers, 2 per weight per token
    forward, 6 forward and backward, and the LM head where a log-prob is read)."""
    from dataflex_rl.tinylm.decoder import distinct_prompts

    per_token, head = 2 * sum(fan_in * fan_out for fan_in, fan_out in shapes), 2 * vocab * hidden
    first, _ = distinct_prompts(batch.input_ids[:, : batch.prompt_length])
    tokens = float(batch.attention_mask[:, : batch.prompt_length][first].sum()) + float(batch.response_mask.sum())
    generated, rows = float(batch.response_mask.sum()), batch.input_ids.shape[0]
    return {"rollout": per_token * tokens + head * generated,
            "update": 3 * (per_token * (tokens - rows) + head * generated), "tokens": tokens - rows}


def matmul_rate(shapes: list[tuple[int, int]], tokens: int) -> float:
    """GFLOP/s of this thread's ``torch.mm`` over the update's products of every linear layer (best of 3)."""
    generator, products = torch.Generator().manual_seed(0), []
    for fan_in, fan_out in shapes:
        x, grad = torch.randn(tokens, fan_in, generator=generator), torch.randn(tokens, fan_out, generator=generator)
        weight = torch.randn(fan_out, fan_in, generator=generator)
        products += [(x, weight.t()), (grad, weight), (grad.t(), x)]
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in products)
    return flops / min(interleaved({"mm": lambda: [torch.mm(a, b) for a, b in products]}, rounds=3)["mm"]) / 1e9


def wandb_service_cpu() -> float:
    """CPU seconds used so far by this process's children (W&B's service process)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])  # user + system
    return total


class LeverBench:
    """One trainer whose levers are switched between steps, so every side sees the same machine load and the same
    (slowly training) weights; each step's parts are kept in ``results``, the "after" step's FLOPs in ``flops``."""

    def __init__(self, trainer) -> None:
        self.trainer, self.results, self.flops, self.numbers = trainer, {}, [], itertools.count(1)
        self.shapes = [(module.in_features, module.out_features) for name, module in trainer.model.named_modules()
                       if isinstance(module, torch.nn.Linear) and name != "lm_head"]  # the LM head is counted apart
        # Every measured step runs the exact bucket gradients, as the step numbered exact_every would.
        every, exact_pass, rollout = trainer.config.stats.exact_every, trainer.exact_bucket_gradients, trainer.rollout
        trainer.exact_bucket_gradients = lambda step, *args: exact_pass(every or step, *args)

        def keep_rollout(step: int):
            self.rollout = rollout(step)  # its token counts give the step's FLOPs
            return self.rollout

        trainer.rollout = keep_rollout

    def step(self, name: str) -> None:
        """One training step and its logging with the levers of side ``name``."""
        trainer, number = self.trainer, next(self.numbers)
        trainer.sampler, trainer.pack, threads, trainer.compile = SIDES[name]
        torch.set_num_threads(threads)
        metrics = trainer.train_step(number)
        start = time.perf_counter()
        trainer.log(number, metrics)
        torch.set_num_threads(1)
        exact = metrics.get(keys.TIMING_EXACT_GRAD, 0.0)
        parts = {"plain": metrics[keys.TIMING_STEP] - exact, "exact": exact, "log": time.perf_counter() - start}
        for part, value in {**parts, **{part: metrics[key] for part, key in PARTS.items()}}.items():
            self.results.setdefault(f"{name}/{part}", []).append(value)
        if name == "after":
            config = trainer.model.config
            self.flops.append(step_flops(self.rollout.batch, self.shapes, config.vocab_size, config.hidden_size))

    def validate(self, sampler: str, items: list) -> None:
        self.trainer.sampler, self.trainer.val_problems = sampler, items
        self.trainer.validate()


def measure(rounds: int, steps_per_side: int, sizes: list[int], overrides: list[str]) -> dict:
    """Interleaved rounds of every lever's steps, validations of the default size with each sampler and of each of
    ``sizes`` (from a held-out pool that large) with the default one, and the matmul rate."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-local-") as directory:
        trainer, loggers = build_trainer(Path(directory) / "run", [f"task.test_size={max(sizes)}", *overrides])
        bench, rates, default_items = LeverBench(trainer), [], trainer.val_problems
        pool = trainer.task.test_problems(max(sizes), seed=trainer.trainer.val_seed)
        sides = {**{name: lambda name=name: [bench.step(name) for _ in range(steps_per_side)] for name in SIDES},
                 "validate/hf": lambda: bench.validate("hf", default_items),
                 "validate/cached": lambda: bench.validate("cached", default_items),
                 **{f"validate {size}": lambda size=size: bench.validate("cached", pool[:size]) for size in sizes},
                 "matmul": lambda: rates.append(matmul_rate(bench.shapes, int(bench.flops[-1]["tokens"])))}
        with loggers:
            interleaved({name: side for name, side in sides.items() if name != "compiled"}, rounds=0)  # warm-up
            # The compiled update's first step compiles (or loads the persistent cache): its extra time, apart.
            start = time.perf_counter()
            bench.step("compiled")
            compile_s = time.perf_counter() - start - min(bench.results["after/plain"])
            for measured in (bench.results, bench.flops, rates):
                measured.clear()
            cpu_start = wandb_service_cpu()
            timed = interleaved(sides, rounds=rounds, warmup=0)
            logged = sum(len(bench.results[f"{side}/plain"]) for side in SIDES)
            service_cpu = (wandb_service_cpu() - cpu_start) / max(logged, 1)
    return {"results": {**bench.results, **timed}, "flops": bench.flops, "rates": rates, "service_cpu": service_cpu,
            "config": trainer.config, "compile_s": compile_s, "sizes": sizes, "default_items": len(default_items)}


def default_steps(measured: dict, name: str, sampler: str) -> list[float]:
    """Per step of side ``name``: a plain step plus its share of a ``total_steps`` run's validations (with
    ``sampler``), exact gradients and logging (W&B's service process too)."""
    results, share = measured["results"], amortised(measured["config"])
    plain, validate = results[f"{name}/plain"], results[f"validate/{sampler}"]
    return [plain[i] + share["exact"] * results[f"{name}/exact"][i] + results[f"{name}/log"][i]
            + share["validate"] * validate[i * len(validate) // len(plain)] + measured["service_cpu"]
            for i in range(len(plain))]


def amortised(config) -> dict[str, float]:
    """Validations and exact-gradient passes per step of a ``total_steps`` run at the config's schedule."""
    total = max(config.trainer.total_steps, 1)
    exact = total // config.stats.exact_every if config.stats.exact_every else 0
    return {"validate": config.trainer.evaluations / total, "exact": exact / total}


def rows_from(measured: dict) -> list[Row]:
    results, config, rates = measured["results"], measured["config"], measured["rates"]
    share = amortised(config)
    before, after = default_steps(measured, "before", "hf"), default_steps(measured, "after", "cached")
    # Useful FLOPs of each round's step (validation and exact passes add a few percent; left out).
    useful = [count["rollout"] + count["update"] for count in measured["flops"]]
    achieved = {side: [useful[i * len(useful) // len(steps)] / seconds / 1e9 for i, seconds in enumerate(steps)]
                for side, steps in (("before", before), ("after", after))}
    of_rate = {side: [value / rates[i * len(rates) // len(values)] for i, value in enumerate(values)]
               for side, values in achieved.items()}
    eager, compiled = min_median(results["after/update"]), min_median(results["compiled/update"])
    # The smaller of the two estimates (from the minima, from the medians): a noisy round must not flip the verdict.
    saved = min(eager[0] - compiled[0], eager[1] - compiled[1]) * config.trainer.total_steps
    verdict = "pays" if saved > measured["compile_s"] else "does not pay"
    parts = {"rollout": sum(results["after/rollout"]), "update": sum(results["after/update"]),
             "mechanism + statistics": sum(results["after/mechanism"]),
             "exact gradients (amortised)": share["exact"] * sum(results["after/exact"]),
             "logging (main thread + W&B service)": sum(results["after/log"]) + measured["service_cpu"] * len(after)}
    return [Row("local step", "default step (before: HF generate + padded HF forward)", "s", min_median(before),
                min_median(after), note="goal: >= 1.5x faster (ratio <= 0.67x)"),
            Row("local step", "rollout: sampler=hf -> cached", "s", min_median(results["before/rollout"]),
                min_median(results["sampler only/rollout"])),
            Row("local step", "update: pack=false -> true", "s", min_median(results["before/update"]),
                min_median(results["pack only/update"])),
            Row("local step", "update: eager -> trainer.compile=true", "s", eager, compiled,
                note=f"first step's compile/cache load {measured['compile_s']:.0f} s vs {saved:.0f} s saved over "
                     f"{config.trainer.total_steps} steps: {verdict}"),
            Row("local step", "default step: 1 -> 2 threads (both levers on)", "s", min_median(after),
                min_median(default_steps(measured, "after, 2 threads", "cached")), note="> 1x: one thread is faster"),
            Row("local step", f"validation ({measured['default_items']} greedy prompts): hf -> cached", "s",
                min_median(results["validate/hf"]), min_median(results["validate/cached"]),
                note=f"{share['validate']:.3f} per step"),
            Row("local step", "achieved GFLOP/s (useful FLOPs / default step)", "GFLOP/s",
                min_median(achieved["before"]), min_median(achieved["after"]),
                note="1-thread matmul on the model's shapes: {:.1f} / {:.1f} GFLOP/s".format(*min_median(rates))),
            Row("local step", "achieved share of that matmul rate (same round)", "", min_median(of_rate["before"]),
                min_median(of_rate["after"]), note="goal: >= 0.6"),
            Row("local step", "shares of the default step", "s", None, min_median(after),
                note=", ".join(f"{name} {value / sum(after):.1%}" for name, value in parts.items())),
            *eval_rows(measured)]


def eval_rows(measured: dict) -> list[Row]:
    """Validations of each size against a training step (its exact gradients, every ``stats.exact_every`` steps, left
    out), and the share of a run's wall time evaluation takes at the old and the default schedule."""
    results, trainer = measured["results"], measured["config"].trainer
    step, sizes = min_median(results["after/plain"]), measured["sizes"]
    rows = [Row("eval", f"validation of {size} items", "s", step, min_median(results[f"validate {size}"]),
                note="before: a training step, 1 thread") for size in sizes]
    for label, size, every in (("old", 256, 25), ("default", trainer.val_size, trainer.val_every)):
        if size in sizes:  # evaluation / (training + evaluation) of a total_steps run
            count = dataclasses.replace(trainer, val_every=every).evaluations
            shares = [count * evaluation / (trainer.total_steps * training + count * evaluation)
                      for training, evaluation in zip(step, min_median(results[f"validate {size}"]), strict=True)]
            rows.append(Row("eval", f"evaluation share of a {trainer.total_steps}-step run, {label} schedule ({size} "
                            f"items every {every} steps)", "", None, (shares[0], shares[1])))
    return rows


def main(argv=None) -> list[Row]:
    args = options(__doc__, argv, rounds=5, steps_per_side=1, sizes=("256,1024,2048,4096", "validation sizes"),
                   override=([], "extra Hydra override (repeatable)"))
    sizes = [int(size) for size in args.sizes.split(",")]
    return printed(rows_from(measure(args.rounds, args.steps_per_side, sizes, args.override)))


if __name__ == "__main__":
    main()
