"""``python -m dataflex_rl.verl.check``: is this environment ready to run the dataflex trainers
(``trainer.v1.trainer_mode=dataflex_sync``, ``dataflex_colocate_async``, ``dataflex_separate_async``)?

verl loads its plugins in ``verl/__init__.py`` and logs a plugin's import error at DEBUG level only, so a plugin that
fails to import shows up later as ``Unknown trainer 'dataflex_sync'``. This doctor checks, in order, and prints
each result with what to do about a failure:

1. the versions that matter (verl, torch, transformers, vLLM, SGLang, TransferQueue, tensordict, Ray, cachetools),
   and whether CUDA is visible;
2. the pieces of verl the plugin builds on (:data:`VERL_PIECES`: the V1 trainer registry, whose modes it lists,
   TransferQueue, the workers' ``set_loss_fn``, the platform, engine, rollout and checkpoint-engine registries),
   with what to install when one is missing (a verl without the V1 trainers, as its development branch plans);
3. the plugin module imports (its traceback is printed when it does not);
4. the ``verl.plugins`` entry point names it, and verl resolves every dataflex trainer mode through it in a fresh
   process, as ``python -m verl.trainer.main_ppo`` will;
5. with a command (an experiment and its arguments, as ``python -m dataflex_rl.verl.command`` takes them, or a verl
   override list after ``--``): verl's config composes with it, and its ``dataflex`` block and the settings the
   trainer guards (the learning-rate schedule of a staged mechanism, ``dataflex_run``) are valid;
6. verl's CPU mode (:mod:`dataflex_rl.verl.cpu`) in a fresh process with its environment: platform ``cpu``, the
   FSDP2 engine for it, the ``dataflex_cpu`` rollout.

Usage::

    python -m dataflex_rl.verl.check
    python -m dataflex_rl.verl.check verl_kk_3b model=/models/Qwen2.5-3B-Instruct data_dir=/data/kk \\
        dataflex.mechanism=isolate dataflex.actuator.name=lopti
    python -m dataflex_rl.verl.check -- trainer.v1.trainer_mode=dataflex_sync +dataflex.mechanism=reweight ...

Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import subprocess
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from dataflex_rl.verl import command
from typing import Any

PLUGIN_MODULE = "dataflex_rl.verl.trainer"
ENTRY_POINT_GROUP = "verl.plugins"
# (what, module, attribute) of each piece of verl the plugin and the CPU mode use; a missing one fails the check.
VERL_PIECES = (
    ("V1 trainer registry", "verl.trainer.ppo.v1.trainer_base", "register_trainer"),
    ("V1 trainer lookup", "verl.trainer.ppo.v1.trainer_base", "get_trainer_cls"),
    ("TransferQueue", "transfer_queue", "kv_batch_put"),
    ("set_loss_fn of the actor workers", "verl.workers.engine_workers", "ActorRolloutRefWorker.set_loss_fn"),
    ("platform registry", "verl.plugin.platform.platform_manager", "PlatformRegistry"),
    ("engine registry", "verl.workers.engine.base", "EngineRegistry"),
    ("rollout replica registry", "verl.workers.rollout.replica", "RolloutReplicaRegistry"),
    ("checkpoint engine registry", "verl.checkpoint_engine.base", "CheckpointEngineRegistry"),
)
EXPECTED_VERL = "0.9.1"
CHECKPOINT_BACKEND_KEY = "actor_rollout_ref.rollout.checkpoint_engine.backend"
SEPARATE_ASYNC = "dataflex_separate_async"  # the mode whose rollout pool needs a checkpoint engine
# (label, distribution name) of the packages whose versions decide whether a verl run works.
DISTRIBUTIONS = (
    ("verl", "verl"),
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("vllm", "vllm"),
    ("sglang", "sglang"),
    ("transfer_queue", "TransferQueue"),
    ("tensordict", "tensordict"),
    ("ray", "ray"),
    ("cachetools", "cachetools"),
    ("dataflex-rl", "dataflex-rl"),
)
# Needed by verl's V1 trainer (besides verl's own requirements); a missing one fails the check.
REQUIRED = ("verl", "torch", "transformers", "transfer_queue", "tensordict", "ray", "cachetools")


class Report:
    """Collects check results and prints each as it comes."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def ok(self, what: str, detail: str = "") -> None:
        """Print a passed check."""
        print(f"ok    {what}" + (f": {detail}" if detail else ""), flush=True)

    def fail(self, what: str, detail: str) -> None:
        """Print a failed check with what to do about it, and count it."""
        self.failures.append(what)
        print(f"FAIL  {what}: {detail}", flush=True)

    def note(self, text: str) -> None:
        """Print a remark that is neither a pass nor a failure."""
        print(f"      {text}", flush=True)


def distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name`` from its metadata; None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(report: Report) -> None:
    """Print the versions (from package metadata: nothing heavy is imported here) and flag missing ones."""
    for label, distribution in DISTRIBUTIONS:
        version = distribution_version(distribution)
        if version is None and label in REQUIRED:
            report.fail(f"{label} installed", f"not found; install it (pip install {distribution})")
        elif label == "verl" and version != EXPECTED_VERL:
            report.fail("verl version", f"{version}; this plugin is written against verl {EXPECTED_VERL}")
        else:
            report.ok(f"{label} version", version or "not installed (optional here)")


def check_cuda(report: Report) -> None:
    """Report the CUDA devices torch sees; only a note without any (the other checks hold on a CPU)."""
    import torch

    if torch.cuda.is_available():
        report.ok("CUDA", f"{torch.cuda.device_count()} device(s), torch built for CUDA {torch.version.cuda}")
    else:
        report.note("CUDA: not available. verl's rollout and FSDP engine need GPUs; the checks below still hold.")


def verl_piece(module: str, attribute: str) -> Any:
    """``module.attribute`` (dotted within the module); raises ImportError or AttributeError when absent."""
    found: Any = importlib.import_module(module)
    for name in attribute.split("."):
        found = getattr(found, name)
    return found


def check_verl_pieces(report: Report) -> bool:
    """Each of :data:`VERL_PIECES`, and verl's own trainer modes; True when every piece is there."""
    missing = []
    for what, module, attribute in VERL_PIECES:
        try:
            verl_piece(module, attribute)
        except Exception as error:  # ImportError, AttributeError, or whatever a broken install raises
            missing.append(what)
            report.fail(f"verl: {what}", f"{module}.{attribute} is missing ({type(error).__name__}: {error})")
        else:
            report.ok(f"verl: {what}", f"{module}.{attribute}")
    if missing:
        report.note(f"the dataflex trainers need verl {EXPECTED_VERL}'s V1 trainers with TransferQueue: install them "
                    f"with pip install verl=={EXPECTED_VERL} TransferQueue (a verl without them runs no dataflex mode)")
        return False
    registry = verl_piece("verl.trainer.ppo.v1.trainer_base", "TRAINER_REGISTRY")
    own = sorted(name for name, cls in registry.items() if not cls.__module__.startswith("dataflex_rl"))
    report.ok("verl trainer modes", f"{', '.join(own)}; dataflex: {', '.join(command.TRAINER_MODES)}")
    absent = sorted(set(command.TRAINER_MODES.values()) - set(own))
    if absent:
        report.fail("verl trainer modes", f"verl has no {absent}, which the dataflex trainers extend; install "
                                          f"verl=={EXPECTED_VERL}")
        return False
    return True


def check_plugin_import(report: Report) -> bool:
    """Import the plugin module the way verl would, but show its traceback."""
    try:
        import verl  # noqa: F401  (verl first: its __init__ loads the entry points, as in a real run)

        importlib.import_module(PLUGIN_MODULE)
    except Exception:  # any import failure is what the user needs to see
        report.fail(f"import {PLUGIN_MODULE}", "it raised (verl would only log this at DEBUG level):")
        print(traceback.format_exc(), file=sys.stdout, flush=True)
        return False
    report.ok(f"import {PLUGIN_MODULE}")
    return True


def check_entry_point(report: Report) -> None:
    """The entry point names the module, and a fresh ``import verl`` resolves the trainer through it alone."""
    found = [entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if entry.value == PLUGIN_MODULE]
    if not found:
        report.fail(f"entry point {ENTRY_POINT_GROUP}",
                    f"no entry point names {PLUGIN_MODULE}; install the project (pip install --no-deps -e .)")
        return
    report.ok(f"entry point {ENTRY_POINT_GROUP}", f"{found[0].name} = {found[0].value}")
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto")
    if policy.strip().lower() == "none":
        report.fail("VERL_USE_EXTERNAL_PLUGINS", "= none: verl loads no plugin; unset it or name 'dataflex' in it")
    code = (
        "from verl.trainer.ppo.v1.trainer_base import get_trainer_cls\n"
        f"for name in {list(command.TRAINER_MODES)!r}:\n"
        "    cls = get_trainer_cls(name)\n"
        "    print(name, cls.__module__, cls.verl_mode)\n"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                            check=False, timeout=600, cwd=Path.home())
    expected = [f"{name} {PLUGIN_MODULE} {mode}" for name, mode in command.TRAINER_MODES.items()]
    modes = ", ".join(command.TRAINER_MODES)
    if result.returncode == 0 and result.stdout.strip().splitlines()[-len(expected):] == expected:
        report.ok(f"verl resolves {modes}", "(fresh process, entry point only)")
    else:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        report.fail(f"verl resolves {modes}", f"in a fresh process (from {Path.home()}):\n{tail}")


def verl_overrides(arguments: Sequence[str]) -> list[str]:
    """The verl overrides of a command: after ``--`` as given, else built from an experiment and its arguments."""
    from dataflex_rl.verl.command import build_verl_command

    if arguments and arguments[0] == "--":
        return list(arguments[1:])
    command = build_verl_command(arguments[0], (), list(arguments[1:]))
    return command[command.index("verl.trainer.main_ppo") + 1 :]


@contextlib.contextmanager
def quiet_verl_import() -> Iterator[None]:
    """Validation imports verl's algorithm registries; keep its start-up notices (no accelerator, optional engines
    missing) off the driver's console. Only this process's import is affected: runs keep their environment."""
    previous = os.environ.get("VERL_LOGGING_LEVEL")
    os.environ["VERL_LOGGING_LEVEL"] = previous or "ERROR"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        if previous is None:
            os.environ.pop("VERL_LOGGING_LEVEL", None)


def compose_verl_config(overrides: Sequence[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides``, resolved as verl's TaskRunner resolves it; a
    :class:`ConfigError` naming the override when it does not compose."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl
    from dataflex_rl.validation import ConfigError

    config_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=list(overrides))
        OmegaConf.resolve(config)
    except Exception as error:  # Hydra's and OmegaConf's errors name the bad override
        raise ConfigError(f"verl config does not compose: {type(error).__name__}: {error}") from None
    return config


def validate_overrides(overrides: Sequence[str], environment: Mapping[str, str] | None = None) -> tuple[Any, Any, Any]:
    """``(config, mechanism, run place)`` of a verl command: :func:`compose_verl_config`, then
    :func:`validate_config`. The command builder and the sweep call it to refuse before launching."""
    config = compose_verl_config(overrides)
    return (config, *validate_config(config, environment))


def check_trainer_mode(config: Any) -> str:
    """``trainer.v1.trainer_mode`` when it names a dataflex trainer (:data:`TRAINER_MODES`), else a
    :class:`ConfigError` naming the key, its value and the allowed ones."""
    from omegaconf import OmegaConf

    return command.check_trainer_mode(OmegaConf.select(config, command.TRAINER_MODE_KEY))


def validate_config(config: Any, environment: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    """``(mechanism, run place)`` after the checks the trainer makes when it is built (the ``dataflex`` block, a
    staged mechanism's LR schedule and distillation, the ``dataflex_run`` and ``dataflex_stats`` blocks) and, in verl's CPU mode
    (``environment`` has ``VERL_PLATFORM=cpu``), the rollout it needs. Raises :class:`ConfigError` naming the key."""
    from omegaconf import OmegaConf

    from dataflex_rl.validation import ConfigError
    from dataflex_rl.verl.run_record import run_place
    from dataflex_rl.verl.trainer import mechanism_from_verl_config, prob_change_every

    mode = check_trainer_mode(config)
    if (environment or {}).get("VERL_PLATFORM") == "cpu":
        from dataflex_rl.verl.cpu.patches import CPU_CHECKPOINT_ENGINE, ROLLOUT_NAME

        rollout = OmegaConf.select(config, "actor_rollout_ref.rollout.name")
        if rollout != ROLLOUT_NAME:
            raise ConfigError(f"actor_rollout_ref.rollout.name = {rollout!r} is not allowed in verl's CPU mode: "
                              f"it needs {ROLLOUT_NAME} (vLLM, SGLang and TRT-LLM need GPUs)")
        backend = OmegaConf.select(config, CHECKPOINT_BACKEND_KEY)
        if mode == SEPARATE_ASYNC and backend != CPU_CHECKPOINT_ENGINE:
            raise ConfigError(f"{CHECKPOINT_BACKEND_KEY} = {backend!r} is not allowed with {command.TRAINER_MODE_KEY}="
                              f"{mode} in verl's CPU mode: its rollout pool gets the weights through "
                              f"{CPU_CHECKPOINT_ENGINE} (verl's engines need GPUs or RDMA)")
    mechanism = mechanism_from_verl_config(config)
    prob_change_every(config)
    return mechanism, run_place(config, mechanism.config.mechanism)


def check_command(report: Report, arguments: Sequence[str]) -> None:
    """Compose verl's config with the command's overrides and validate what the trainer validates at build time."""
    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

    from dataflex_rl.validation import ConfigError
    from dataflex_rl.verl.command import experiment_environment
    from dataflex_rl.verl.trainer import is_staged

    try:
        overrides = verl_overrides(arguments)
        environment = {} if arguments[0] == "--" else experiment_environment(arguments[0])
        config = compose_verl_config(overrides)
    except ConfigError as error:
        report.fail("verl config composes", str(error))
        return
    report.ok("verl config composes", f"{len(overrides)} overrides")
    try:
        check_trainer_mode(config)
    except ConfigError as error:
        report.fail("trainer.v1.trainer_mode", str(error))
        return
    mode = config.trainer.v1.trainer_mode
    if get_trainer_cls(mode).__module__ != PLUGIN_MODULE:
        report.fail("trainer.v1.trainer_mode", f"{mode} resolves to {get_trainer_cls(mode)}")
    try:
        mechanism, place = validate_config(config, environment or dict(os.environ))
    except ConfigError as error:
        report.fail("dataflex block", str(error))
        return
    params = ", ".join(f"{key}={value}" for key, value in mechanism.config.actuator.params.items())
    staged = " (staged: one actor update per stage, per-stage KL and entropy)" if is_staged(mechanism) else ""
    report.ok("dataflex block", f"mechanism={mechanism.config.mechanism}{staged}, actuator="
                                f"{mechanism.config.actuator.name}({params}), warmup_step={mechanism.warmup_step}")
    report.ok("run store", f"{place.dir} (sweep {place.sweep}, run {place.name}, seed {place.seed})" if place
              else "none (no dataflex_run.dir: only verl's own loggers record the run)")


def check_cpu_mode(report: Report) -> None:
    """In a fresh process with verl's CPU-mode environment: the platform is ``cpu``, the FSDP engine resolves for
    it and the ``dataflex_cpu`` rollout is registered (what ``VERL_PLATFORM=cpu`` runs need)."""
    from dataflex_rl.verl.cpu import ENVIRONMENT

    code = (
        "import verl\n"
        "from verl.utils.device import get_device_name\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "from verl.workers.rollout.replica import RolloutReplicaRegistry\n"
        "from dataflex_rl.verl.cpu.patches import ROLLOUT_NAME\n"
        "engine = EngineRegistry.get_engine_cls('language_model', 'fsdp2')\n"
        "replica = RolloutReplicaRegistry.get(ROLLOUT_NAME)\n"
        "print(get_device_name(), engine.__name__, replica.__name__)\n"
    )
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                            check=False, timeout=600, cwd=Path.home(), env={**os.environ, **ENVIRONMENT})
    lines = result.stdout.strip().splitlines()
    if result.returncode == 0 and lines and lines[-1].startswith("cpu "):
        report.ok("verl CPU mode", f"{' '.join(f'{k}={v}' for k, v in ENVIRONMENT.items())}: device, engine, "
                                   f"rollout = {lines[-1]}")
    else:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        report.fail("verl CPU mode", f"with {ENVIRONMENT} in a fresh process:\n{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dataflex_rl.verl.check [COMMAND]``: run the checks in order; 0 when all passed, else 1."""
    parser = argparse.ArgumentParser(prog="python -m dataflex_rl.verl.check", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="an experiment and its arguments, or -- and verl overrides (optional)")
    options = parser.parse_args(argv)
    report = Report()
    check_versions(report)
    check_cuda(report)
    if check_verl_pieces(report) and check_plugin_import(report):
        check_entry_point(report)
        check_cpu_mode(report)
        if options.command:
            check_command(report, options.command)
    if report.failures:
        print(f"\n{len(report.failures)} check(s) failed: {', '.join(report.failures)}", flush=True)
        return 1
    print("\nall checks passed", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
