"""``python -m dataflex_rl.verl.check``: which dataflex routes can this environment run? (docs/verl.md)"""

import argparse
import functools
import importlib
import importlib.metadata
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from dataflex_rl.validation import ConfigError
from dataflex_rl.verl import VERL_VERSION
from dataflex_rl.verl.command import build_verl_command, experiment_environment, verl_overrides_of
from dataflex_rl.verl.config import (LOSS_MODE, LOSS_MODE_KEY, ROUTE_TRAINERS, TRAINER_MODE_KEY, TRAINER_MODES,
                                     compose_verl_config, route_of, validate_config)
from dataflex_rl.verl.cpu import ENVIRONMENT as CPU_ENVIRONMENT, ROLLOUT_NAME

PLUGIN_MODULE = "dataflex_rl.verl.plugin"  # what the entry point names
TRAINER_MODULE = "dataflex_rl.verl.trainer"
ENTRY_POINT_GROUP = "verl.plugins"
# The routes (config.route_of) and, for each, (what, module, attribute) of the pieces of verl it builds on.
ROUTES = {"policy_loss": f"the policy-loss route ({LOSS_MODE_KEY}={LOSS_MODE})",
          "trainer": f"the dataflex trainer modes ({TRAINER_MODE_KEY}={'|'.join(TRAINER_MODES)})"}
VERL_PIECES = {
    "policy_loss": (
        ("policy-loss registry", "verl.trainer.ppo.core_algos", "register_policy_loss"),
        ("policy-loss lookup", "verl.trainer.ppo.core_algos", "get_policy_loss_fn"),
        ("policy-loss config", "verl.workers.config", "PolicyLossConfig"),
    ),
    "trainer": (
        ("V1 trainer registry", "verl.trainer.ppo.v1.trainer_base", "register_trainer"),
        ("V1 trainer lookup", "verl.trainer.ppo.v1.trainer_base", "get_trainer_cls"),
        ("TransferQueue", "transfer_queue", "kv_batch_put"),
        ("set_loss_fn of the actor workers", "verl.workers.engine_workers", "ActorRolloutRefWorker.set_loss_fn"),
    ),
}
# What the CPU mode registers with (every route); a missing one fails the check.
CPU_PIECES = (
    ("platform registry", "verl.plugin.platform.platform_manager", "PlatformRegistry"),
    ("engine registry", "verl.workers.engine.base", "EngineRegistry"),
    ("rollout replica registry", "verl.workers.rollout.replica", "RolloutReplicaRegistry"),
    ("checkpoint engine registry", "verl.checkpoint_engine.base", "CheckpointEngineRegistry"),
)
# label -> distribution name of the packages whose versions decide whether a verl run works.
DISTRIBUTIONS = {"verl": "verl", "torch": "torch", "transformers": "transformers", "vllm": "vllm",
                 "sglang": "sglang", "transfer_queue": "TransferQueue", "tensordict": "tensordict", "ray": "ray",
                 "cachetools": "cachetools", "dataflex-rl": "dataflex-rl"}
# Needed by verl's trainers (besides verl's own requirements); a missing one fails the check. TransferQueue: the
# trainer modes only (VERL_PIECES).
REQUIRED = ("verl", "torch", "transformers", "tensordict", "ray", "cachetools")


class Report:
    """One line per check: ``ok``, ``FAIL`` (counted in :attr:`failures`), ``no`` (absent, not a failure), or a
    note (mark ``""``)."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def line(self, mark: str, what: str, detail: str = "") -> None:
        if mark == "FAIL":
            self.failures.append(what)
        print(f"{mark:<6}{what}" + (f": {detail}" if detail else ""), flush=True)


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(report: Report) -> None:
    for label, distribution in DISTRIBUTIONS.items():
        version = distribution_version(distribution)
        if version is None and label in REQUIRED:
            report.line("FAIL", f"{label} installed", f"not found; install it (pip install {distribution})")
        elif label == "verl" and version != VERL_VERSION:
            report.line("FAIL", "verl version", f"{version}; this plugin is written against verl {VERL_VERSION}")
        else:
            report.line("ok", f"{label} version", version or "not installed (optional here)")


def check_cuda(report: Report) -> None:
    import torch

    if torch.cuda.is_available():
        report.line("ok", "CUDA", f"{torch.cuda.device_count()} device(s), torch built for CUDA {torch.version.cuda}")
    else:
        report.line("", "CUDA: not available. verl's rollout and FSDP engine need GPUs; the checks below still hold.")


def missing_pieces(pieces: Sequence[tuple[str, str, str]]) -> dict[str, str]:
    """``what -> why`` of each piece this verl lacks."""
    missing = {}
    for what, module, attribute in pieces:
        try:
            functools.reduce(getattr, attribute.split("."), importlib.import_module(module))
        except Exception as error:  # ImportError, AttributeError, or whatever a broken install raises
            missing[what] = f"{module}.{attribute} is missing ({type(error).__name__}: {error})"
    return missing


def check_verl_pieces(report: Report) -> set[str]:
    """The routes this verl supports: a missing piece of the policy-loss route or the CPU mode fails the check, one
    of the trainer modes' only says the modes are not on this verl (verl's neo branch has no V1 trainers)."""
    supported = set()
    for route, pieces in VERL_PIECES.items():
        missing = missing_pieces(pieces)
        for what, module, attribute in pieces:
            mark = "ok" if what not in missing else "FAIL" if route == "policy_loss" else "no"
            report.line(mark, f"verl: {what}", missing.get(what, f"{module}.{attribute}"))
        if not missing:
            supported.add(route)
    for what, reason in missing_pieces(CPU_PIECES).items():
        report.line("FAIL", f"verl: {what}", reason)
    if "trainer" in supported:
        registry = importlib.import_module("verl.trainer.ppo.v1.trainer_base").TRAINER_REGISTRY
        own = sorted(name for name, cls in registry.items() if not cls.__module__.startswith("dataflex_rl"))
        report.line("ok", "verl trainer modes", f"{', '.join(own)}; dataflex: {', '.join(TRAINER_MODES)}")
        absent = sorted(set(TRAINER_MODES.values()) - set(own))
        if absent:
            report.line("FAIL", "verl trainer modes", f"verl has no {absent}, which the dataflex trainers extend; "
                                                      f"install verl=={VERL_VERSION}")
            supported.discard("trainer")
    for route, text in ROUTES.items():
        if route in supported:
            report.line("ok", f"route: {text}", "supported by this verl")
        else:
            report.line("no", f"route: {text}", f"not supported by this verl (install verl=={VERL_VERSION}"
                                                f"{' and TransferQueue' if route == 'trainer' else ''})")
    return supported


def check_plugin_import(report: Report) -> bool:
    try:
        import verl  # noqa: F401  (verl first: its __init__ loads the entry points, as in a real run)

        importlib.import_module(PLUGIN_MODULE)
    except Exception:  # any import failure is what the user needs to see
        report.line("FAIL", f"import {PLUGIN_MODULE}", "it raised (verl would only log this at DEBUG level):")
        print(traceback.format_exc(), flush=True)
        return False
    report.line("ok", f"import {PLUGIN_MODULE}")
    return True


def fresh_python(code: str, environment: dict[str, str] | None = None) -> tuple[list[str] | None, str]:
    """Run ``code`` in a fresh Python: ``(output lines or None on failure, last lines of output)``."""
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                            check=False, timeout=600, cwd=Path.home(), env={**os.environ, **(environment or {})})
    tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
    return (result.stdout.strip().splitlines() if result.returncode == 0 else None), tail


def check_entry_point(report: Report, routes: set[str]) -> None:
    found = [entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
             if entry.value == PLUGIN_MODULE]
    if not found:
        return report.line("FAIL", f"entry point {ENTRY_POINT_GROUP}",
                           f"no entry point names {PLUGIN_MODULE}; install the project (pip install --no-deps -e .)")
    report.line("ok", f"entry point {ENTRY_POINT_GROUP}", f"{found[0].name} = {found[0].value}")
    if os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower() == "none":
        report.line("FAIL", "VERL_USE_EXTERNAL_PLUGINS",
                    "= none: verl loads no plugin; unset it or name 'dataflex' in it")
    modes = list(TRAINER_MODES) if "trainer" in routes else []
    lines, tail = fresh_python(
        "import verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn\n"
        f"print({LOSS_MODE!r}, get_policy_loss_fn({LOSS_MODE!r}).__module__)\n"
        f"for name in {modes!r}:\n    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls\n"
        "    print(name, get_trainer_cls(name).__module__, get_trainer_cls(name).verl_mode)\n")
    expected = [f"{LOSS_MODE} dataflex_rl.verl.policy_loss",
                *(f"{name} {TRAINER_MODULE} {TRAINER_MODES[name]}" for name in modes)]
    resolved = ", ".join([f"{LOSS_MODE_KEY}={LOSS_MODE}", *modes])
    if lines is not None and lines[-len(expected):] == expected:
        report.line("ok", f"verl resolves {resolved}", "(fresh process, entry point only)")
    else:
        report.line("FAIL", f"verl resolves {resolved}", f"in a fresh process (from {Path.home()}):\n{tail}")


def check_cpu_mode(report: Report) -> None:
    lines, tail = fresh_python(
        "import verl; from verl.utils.device import get_device_name; from verl.workers.engine.base import "
        "EngineRegistry; from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        f"print(get_device_name(), EngineRegistry.get_engine_cls('language_model', 'fsdp2').__name__, "
        f"RolloutReplicaRegistry.get({ROLLOUT_NAME!r}).__name__)\n", CPU_ENVIRONMENT)
    if lines and lines[-1].startswith("cpu "):
        variables = " ".join(f"{name}={value}" for name, value in CPU_ENVIRONMENT.items())
        report.line("ok", "verl CPU mode", f"{variables}: device, engine, rollout = {lines[-1]}")
    else:
        report.line("FAIL", "verl CPU mode", f"with {CPU_ENVIRONMENT} in a fresh process:\n{tail}")


def check_command(report: Report, arguments: Sequence[str], routes: set[str] = frozenset(ROUTES)) -> None:
    try:
        if arguments[0] == "--":
            overrides, environment = list(arguments[1:]), {}
        else:
            overrides = verl_overrides_of(build_verl_command(arguments[0], (), list(arguments[1:])))
            environment = experiment_environment(arguments[0])
        config = compose_verl_config(overrides)
    except ConfigError as error:
        return report.line("FAIL", "verl config composes", str(error))
    report.line("ok", "verl config composes", f"{len(overrides)} overrides")
    try:
        route = route_of(config)
    except ConfigError as error:
        return report.line("FAIL", "route", str(error))
    if route not in routes:
        return report.line("FAIL", "route", f"{ROUTES[route]} is not supported by this verl (see above)")
    if route == "trainer":
        from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

        mode = config.trainer.v1.trainer_mode
        if get_trainer_cls(mode).__module__ != TRAINER_MODULE:
            report.line("FAIL", TRAINER_MODE_KEY, f"{mode} resolves to {get_trainer_cls(mode)}")
    where = (f"{TRAINER_MODE_KEY}={config.trainer.v1.trainer_mode}" if config.trainer.use_v1
             else f"verl's V0 trainer ({ROUTE_TRAINERS['v0']})")
    report.line("ok", "route", f"{ROUTES[route]} in {where}")
    try:
        mechanism, place = validate_config(config, environment or dict(os.environ))
    except ConfigError as error:
        return report.line("FAIL", "dataflex block", str(error))
    actuator = mechanism.config.actuator
    params = ", ".join(f"{key}={value}" for key, value in actuator.params.items())
    staged = " (staged: one actor update per stage, per-stage KL and entropy)" if mechanism.staged else ""
    report.line("ok", "dataflex block", f"mechanism={mechanism.config.mechanism}{staged}, actuator={actuator.name}"
                                        f"({params}), warmup_step={mechanism.warmup_step}")
    report.line("ok", "run store", f"{place.dir} (sweep {place.sweep}, run {place.name}, seed {place.seed})" if place
                else "none (no dataflex_run.dir: only verl's own loggers record the run)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataflex_rl.verl.check",
                                     description="Check that this environment can run the dataflex trainers.")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="an experiment and its arguments, or -- and verl overrides (optional)")
    options = parser.parse_args(argv)
    report = Report()
    check_versions(report)
    check_cuda(report)
    routes = check_verl_pieces(report)
    if "policy_loss" in routes and not report.failures and check_plugin_import(report):
        check_entry_point(report, routes)
        check_cpu_mode(report)
        if options.command:
            check_command(report, options.command, routes)
    if report.failures:
        print(f"\n{len(report.failures)} check(s) failed: {', '.join(report.failures)}", flush=True)
        return 1
    print("\nall checks passed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
