"""A scripted stand-in for ``python -m dataflex_rl.local.train`` with the same command-line contract and run store.

Used where a test checks the driver's own logic (pruning, launchers) and needs known metric values and timing:
``val/accuracy = alpha + 0.01 * seed`` and ``critic/score/mean = step / total`` at every step,
``SCRIPTED_TRAIN_STEP_S`` seconds per step (default 0). ``mode=sft`` appends a line to ``<sft.cache_dir>/sft_calls``,
prints ``SFT step i/n`` for ``sft.steps=n`` (same pace) and exits 0. The same ``run_dir`` again resumes after
the last logged step; a completed run exits 0 at once. SIGTERM marks the run interrupted (exit 130).
``SCRIPTED_TRAIN_FAIL=<run name>`` makes that run fail (exit 1, status failed). ``SCRIPTED_TRAIN_NOISE=<sd>`` adds
``sd * z`` to ``val/accuracy``, ``z`` a standard normal fixed by (alpha, seed), so seed-paired differences vary.
A ``trainer.lr`` axis adds ``100 * lr`` to ``val/accuracy``; ``SCRIPTED_TRAIN_QUIET_LR=<lr>`` divides the noise of
that learning rate's runs by 100. ``config.yaml`` is the run's config and ``meta.json``
its identity computed from it, as the real trainer records them: the ``axes=[...]`` the driver passes, with the
run's own values of those keys.

Its settings come as the real trainer's do: overrides (``key=value``; a key not given takes the stand-in's own
default), or ``--config-file PATH``, the resolved config the driver composed (every key of ``conf/train.yaml``).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

from dataflex_rl.run_config import CONFIG_FILE_FLAG, read_config_file
from dataflex_rl.tracking.identity import RunIdentity, axis_name
from dataflex_rl.tracking.run_store import RunStore, flatten_config, read_status


def _value(text: str) -> object:
    """An override's value as YAML would type it (numbers as numbers)."""
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number


def _config(argv: list[str]) -> dict[str, object]:
    """The run's config: the ``--config-file`` config, else the overrides (typed) nested by their dotted keys."""
    if argv[:1] == [CONFIG_FILE_FLAG]:
        return read_config_file(argv[1])
    config: dict[str, object] = {}
    for argument in argv:
        key, _, value = argument.partition("=")
        *parents, last = key.lstrip("+").split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = ([item for item in value.strip("[]").split(",") if item] if key.lstrip("+") == "axes"
                      else _value(value))
    return config


def main(argv: list[str]) -> int:
    config = _config(argv)
    options = flatten_config(config)
    options["axes"] = config.get("axes") or []
    if options.get("mode") == "sft":
        cache = Path(str(options.get("sft.cache_dir", ".cache/sft")))
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "sft_calls", "a") as calls:
            calls.write(" ".join(argv) + "\n")
        steps = int(options.get("sft.steps", 0))
        for step in range(1, steps + 1):  # the progress lines the real SFT logs
            time.sleep(float(os.environ.get("SCRIPTED_TRAIN_STEP_S", "0")))
            print(f"SFT step {step}/{steps}: loss 1.0", file=sys.stderr, flush=True)
        return 0
    run_dir = Path(str(options["run_dir"]))
    # Written through the run store's own writer (and its lock), as the real trainer does.
    store = RunStore(run_dir)
    lock = store.lock()
    status = read_status(run_dir)
    if status is not None and status["state"] == "completed":
        return 0
    alpha = float(options.get("dataflex.actuator.params.alpha", 0.5))
    seed = int(options.get("seed", 1))
    total = int(options.get("trainer.total_steps", 3))
    name = str(options.get("run_name") or run_dir.name)
    store.write_config(config)
    identity = RunIdentity.for_config(config, sweep=str(options.get("sweep") or "scripted"), run=name,
                                      backend="local", mechanism="reweight", alpha=alpha, seed=seed,
                                      axis_keys=options["axes"])
    axes = dict(identity.axes)
    store.write_meta(identity)
    step = store.last_logged_step() or 0

    def stop(signum, frame):
        store.set_status("interrupted", step=step, error=f"signal {signum}")
        sys.exit(130)

    signal.signal(signal.SIGTERM, stop)
    store.set_status("running", step=step)
    if os.environ.get("SCRIPTED_TRAIN_FAIL") == name:
        store.set_status("failed", step=step, error="scripted failure")
        return 1
    step_seconds = float(os.environ.get("SCRIPTED_TRAIN_STEP_S", "0"))
    noise = float(os.environ.get("SCRIPTED_TRAIN_NOISE", "0")) * random.Random(f"{alpha}-{seed}").gauss(0.0, 1.0)
    lr = float(axes.get(axis_name("trainer.lr")) or 0.0)
    if lr and lr == float(os.environ.get("SCRIPTED_TRAIN_QUIET_LR", "nan")):
        noise /= 100.0
    noise += 100.0 * lr
    while step < total:
        time.sleep(step_seconds)
        step += 1
        store.log_metrics(step, {"val/accuracy": alpha + 0.01 * seed + noise, "critic/score/mean": step / total})
    store.detach()
    store.set_status("completed", step=step)
    lock.release()
    print(f"scripted run {name} completed at step {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
