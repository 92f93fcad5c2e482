"""``python -m sweeps.make <target>``: the command a ``make`` target runs, built from the Makefile's variables
(exported raw as ``DATAFLEX_MAKE_<NAME>``), printed and exec'd, so no shell ever reads a value. ``DRY_RUN`` and ``LR``
are switches (1/true/yes/on or empty/0/false/no/off; anything else exits 2)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from dataflex_rl.validation import ConfigError, parse_switch

ENV_PREFIX = "DATAFLEX_MAKE_"
# Every variable the Makefile exports (its ``MAKE_VARIABLES`` line names the same ones; a test checks they agree).
VARIABLES = ("ALPHA", "SEEDS", "MECH", "ETA", "STEPS", "JOBS", "SWEEP", "BACKEND", "LAUNCHER", "SWEEP_ARGS",
             "DRY_RUN", "EXTRA", "TARGET_MDE", "MAX_SEEDS", "LR", "ARGS", "VERL_EXPERIMENT", "EXPERIMENT", "WARM_START",
             "RESULTS")
# make sweep: variable -> driver key (sweeps/sweep_config.py SweepConfig), in the order they are passed.
SWEEP_KEYS = (("EXPERIMENT", "experiment"), ("ALPHA", "alpha"), ("SEEDS", "seeds"), ("BACKEND", "backend"),
              ("LAUNCHER", "launcher"), ("JOBS", "jobs"), ("STEPS", "steps"), ("SWEEP", "name"), ("MECH", "mechanisms"),
              ("ETA", "eta"), ("TARGET_MDE", "target_mde"), ("MAX_SEEDS", "max_seeds"),
              ("VERL_EXPERIMENT", "verl.experiment"), ("WARM_START", "warm_start"))
# make tune: variable -> key of the study (conf/sweeps/optuna.yaml).
TUNE_KEYS = (("SWEEP", "name"), ("STEPS", "steps"), ("JOBS", "jobs"), ("SEEDS", "seeds"), ("BACKEND", "backend"),
             ("LAUNCHER", "launcher"), ("VERL_EXPERIMENT", "verl.experiment"), ("WARM_START", "warm_start"))
# make tune: the variables of make sweep a study has no use for, each with what to do instead (refused when given).
TUNE_REFUSED = {
    "ALPHA": "make tune searches alpha itself (conf/sweeps/optuna.yaml search:); confirm a value with make sweep "
             "ALPHA=<best>",
    "MECH": "make tune searches alpha itself, on one preset; pick it with EXTRA=\"dataflex=<preset>\"",
    "ETA": "make tune searches alpha itself, with no eta axis; set an eta with "
           "EXTRA=\"dataflex.actuator.params.eta=<value>\"",
    "EXPERIMENT": "a named experiment's grid sweeps presets, which a study does not; tune alpha on the experiment's "
                  "runs with EXTRA=\"experiment=<name>\"",
    "TARGET_MDE": "make tune runs a fixed number of seeds per trial (SEEDS), it plans none",
    "MAX_SEEDS": "make tune runs a fixed number of seeds per trial (SEEDS), it plans none",
    "ARGS": "ARGS is for make train",
    "RESULTS": "RESULTS is for make docs-results",
}
TARGETS = ("sweep", "tune", "report", "docs-results", "train", "notebook-dir")
EXIT_REFUSED = 2


def variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    return {name: environ.get(ENV_PREFIX + name, "") for name in VARIABLES}


def split_words(name: str, value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as error:
        raise ConfigError(f"{name} = {value!r} is not allowed: {error} (quote each value that holds spaces, "
                          f"e.g. {name}=\"key='a b'\")") from None


def sweep_argv(values: Mapping[str, str], mapping: Sequence[tuple[str, str]] = SWEEP_KEYS,
               switches: Sequence[str] = ()) -> list[str]:
    argv = [*(f"{key}={values[name]}" for name, key in mapping if values[name].strip()), *switches]
    if values["EXTRA"].strip():
        argv.append(f"extra=[{values['EXTRA']}]")
    argv += split_words("SWEEP_ARGS", values["SWEEP_ARGS"])
    if parse_switch("DRY_RUN", values["DRY_RUN"]):
        argv.append("dry_run=true")  # last: nothing after it can turn the dry run off
    return argv


def tune_argv(values: Mapping[str, str]) -> list[str]:
    for name, reason in TUNE_REFUSED.items():
        if values[name].strip():
            raise ConfigError(f"make tune: {name} = {values[name]!r} is not allowed: {reason}")
    return sweep_argv(values, TUNE_KEYS, ["tune_lr=true"] if parse_switch("LR", values["LR"]) else [])


def sweep_folder(values: Mapping[str, str]) -> str:
    name = values["SWEEP"]
    if name:
        from sweeps.sweep_config import check_sweep_name

        return os.path.join("runs", check_sweep_name(name, "SWEEP"))
    from analysis.load import resolve_sweep_dir

    try:
        return str(resolve_sweep_dir(None))
    except FileNotFoundError as error:
        raise ConfigError(f"SWEEP = '' is not allowed here: {error}; give SWEEP=<name> (a folder runs/<name>)") \
            from None


def command(target: str, values: Mapping[str, str]) -> list[str]:
    python = sys.executable
    if target == "sweep":
        return [python, "-m", "sweeps", *sweep_argv(values)]
    if target == "tune":
        return [python, "-m", "sweeps.tune", *tune_argv(values)]
    if target == "report":
        return [python, "-m", "analysis.report", sweep_folder(values)]
    if target == "docs-results":
        if not values["SWEEP"] or not values["RESULTS"]:
            raise ConfigError(f"SWEEP = {values['SWEEP']!r}, RESULTS = {values['RESULTS']!r} are not allowed: "
                              f"make docs-results needs both, e.g. make docs-results SWEEP=<name> RESULTS=default")
        from analysis.results import check_results_name

        name = check_results_name(values["RESULTS"])
        return [python, "-m", "analysis.results", sweep_folder(values), f"--name={name}"]  # never read as an option
    if target == "train":
        return [python, "-m", "dataflex_rl.local.train", *split_words("ARGS", values["ARGS"])]
    raise ConfigError(f"target = {target!r} is not allowed; allowed targets: {', '.join(TARGETS)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Print the command, then exec it; ``notebook-dir`` prints the folder ``make notebook`` opens."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print(f"usage: python -m sweeps.make {{{','.join(TARGETS)}}}", file=sys.stderr)
        return EXIT_REFUSED
    values = variables()
    try:
        if argv[0] == "notebook-dir":
            print(sweep_folder(values))
            return 0
        full = command(argv[0], values)
    except ConfigError as error:
        print(f"error: make {argv[0]} refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print(shlex.join(full), flush=True)
    os.execv(full[0], full)
    return 0  # pragma: no cover - execv does not return


if __name__ == "__main__":
    sys.exit(main())
