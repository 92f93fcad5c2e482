"""A scripted stand-in for ``python -m dataflex_rl.train`` with the same command-line contract and run store.

Used where a test checks the driver's own logic (pruning, launchers) and needs known metric values and timing:
``val/accuracy = alpha + 0.01 * seed`` and ``critic/score/mean = step / total`` at every step,
``SCRIPTED_TRAIN_STEP_S`` seconds per step (default 0). ``mode=sft`` appends a line to ``<sft.cache_dir>/sft_calls``,
prints ``SFT step i/n`` for ``sft.steps=n`` (same pace) and exits 0. The same ``run_dir`` again resumes after
the last logged step; a completed run exits 0 at once. SIGTERM marks the run interrupted (exit 130).
``SCRIPTED_TRAIN_FAIL=<run name>`` makes that run fail (exit 1, status failed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    options = {}
    for argument in argv:
        key, _, value = argument.partition("=")
        options[key.lstrip("+")] = value
    if options.get("mode") == "sft":
        cache = Path(options.get("sft.cache_dir", ".cache/sft"))
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "sft_calls", "a") as calls:
            calls.write(" ".join(argv) + "\n")
        for step in range(1, int(options.get("sft.steps", 0)) + 1):  # the progress lines the real SFT logs
            time.sleep(float(os.environ.get("SCRIPTED_TRAIN_STEP_S", "0")))
            print(f"SFT step {step}/{options['sft.steps']}: loss 1.0", file=sys.stderr, flush=True)
        return 0
    run_dir = Path(options["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    status_path = run_dir / "status.json"
    if status_path.exists() and json.loads(status_path.read_text())["state"] == "completed":
        return 0
    alpha = float(options.get("dataflex.actuator.params.alpha", 0.5))
    seed = int(options.get("seed", 1))
    total = int(options.get("trainer.total_steps", 3))
    name = options.get("run_name", run_dir.name)
    write_json(run_dir / "meta.json", {"sweep": options.get("sweep"), "run": name, "backend": "local",
                                       "mechanism": "reweight", "alpha": alpha, "seed": seed})
    metrics = run_dir / "metrics.jsonl"
    done = [json.loads(line)["step"] for line in metrics.read_text().splitlines()] if metrics.exists() else []
    step = max(done, default=0)

    def stop(signum, frame):
        write_json(status_path, {"state": "interrupted", "step": step, "error": f"signal {signum}"})
        sys.exit(130)

    signal.signal(signal.SIGTERM, stop)
    write_json(status_path, {"state": "running", "step": step, "error": None})
    if os.environ.get("SCRIPTED_TRAIN_FAIL") == name:
        write_json(status_path, {"state": "failed", "step": step, "error": "scripted failure"})
        return 1
    step_seconds = float(os.environ.get("SCRIPTED_TRAIN_STEP_S", "0"))
    with open(metrics, "a") as log:
        while step < total:
            time.sleep(step_seconds)
            step += 1
            log.write(json.dumps({"step": step, "val/accuracy": alpha + 0.01 * seed,
                                  "critic/score/mean": step / total}) + "\n")
            log.flush()
    write_json(status_path, {"state": "completed", "step": step, "error": None})
    print(f"scripted run {name} completed at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
