"""One sweep invocation (``python -m sweeps``) as one pass: plan the grid's runs (:mod:`sweeps.plan`), launch them
in a session (:mod:`sweeps.runner`), then print the closing tables and write the report (:mod:`sweeps.closing`).
With ``target_mde`` the seeds are planned cell by cell from a pilot and looks (:mod:`sweeps.seed_plan`)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence

from dataflex_rl.validation import ConfigError
from sweeps.sweep_config import SweepConfig
from sweeps.grid import RunSpec, default_name, expand_grid
from sweeps.plan import plan_sweep
from sweeps.closing import report_sweep
from sweeps.runner import EXIT_FAILED, EXIT_REFUSED, SessionRefused, SweepSession


def run_sweep(config: SweepConfig, argv: Sequence[str] = (), keep: Callable[[RunSpec], bool] | None = None) -> int:
    """Returns the exit status (0 all completed, 1 a run failed, 2 refused, 128+n stopped); ``keep``: which of the
    grid's runs this invocation runs (a seed plan's look), all by default."""
    try:
        name = config.name or default_name(config)
        specs = expand_grid(config)  # a bad value refuses the sweep, a seed plan's pilot too, before anything starts
        specs = [spec for spec in specs if keep is None or keep(spec)]
        if config.target_mde is not None and not config.dry_run:
            from sweeps.seed_plan import run_planned_sweep  # analysis (pandas) only when seeds are planned

            return run_planned_sweep(dataclasses.replace(config, name=name), argv, run_sweep)
        plan, note = plan_sweep(config, name, specs)
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if config.dry_run:
        print(f"sweep {plan.name}: {len(plan.runs)} run(s), {plan.jobs} at once, folder {plan.sweep_dir} (dry run: "
              f"nothing is started)")
        for run in plan.warm_starts:
            print(f"# warm start {run.name}\n{run.shell_line()}")
        for run in plan.runs:
            print(f"# {run.name}\n{run.shell_line()}")
        return 0
    try:
        with SweepSession(plan, argv, kind="sweep") as session:
            session.run_grid(note)
    except (SessionRefused, ConfigError) as error:  # ConfigError: a run still alive from an earlier driver
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except OSError as error:  # the record was closed as failed (SweepSession.__exit__)
        print(f"error: the sweep stopped: {error}; sweep.json records this invocation as failed", file=sys.stderr)
        return EXIT_FAILED
    return report_sweep(plan, session.manifest, session.exit_code, note)
