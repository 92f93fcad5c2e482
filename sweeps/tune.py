"""``python -m sweeps.tune [key=value ...]`` (``make tune``): Optuna search over alpha (and ``trainer.lr`` with
``tune_lr=true``, ``make tune LR=1``), maximising the final-window mean of the validation accuracy (the mean of each
run's last ``final_window`` evaluations, as the report uses) averaged over seeds. An estimate of the study's wall
time is printed before it starts; ``dry_run=true`` prints the first trial's command lines and the estimate only.

- One OS process per run: each trial runs its seeds as child processes through the sweep's own launcher and
  scheduling loop (:class:`sweeps.runner.SweepRunner`), ``jobs`` at once, inside the same
  :class:`~sweeps.driver.SweepSession` as a grid sweep (folder lock, ``sweep.json``, invocation record, SFT warm
  start, exit code).
- Storage: ``<root>/<name>/optuna.db`` (sqlite), so the same command resumes the study: it runs only the trials
  still missing to reach ``n_trials`` finished (completed or pruned) ones. A trial left running by a killed driver
  is marked failed and, like any failed trial, tried again (up to ``retries`` times) with the same parameters and
  the same run folders, so its runs resume from their checkpoints.
- Pruning: while a trial's runs train, the driver reads ``val/accuracy`` from their ``metrics.jsonl``; at each step
  every seed has reached, ``trial.report(mean over seeds, step)``; when the pruner (median by default) says so, the
  runs are stopped (SIGTERM, marked interrupted) and the trial is pruned.
- Runs live in the study folder as ``t<trial>-s<seed>`` run stores listed in its ``sweep.json``.

Look at the study with ``optuna-dashboard sqlite:///runs/<name>/optuna.db``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dataflex_rl import keys
from dataflex_rl.keys import ALPHA_KEY, check_metric_key
from dataflex_rl.overrides import hydra_value
from dataflex_rl.validation import ConfigError, check_choice, check_int_at_least, to_plain, unknown_keys
from sweeps.backends import plan_runs, plan_warm_starts
from sweeps.commands import PlannedRun, SweepPlan
from sweeps.config import Axis, SweepConfig
from sweeps.driver import SessionRefused, SweepSession, concurrency, warm_start_threads
from sweeps.grid import RunSpec, default_name, warm_start_seed
from sweeps.launchers import Job
from sweeps.planning import describe_estimate, estimate_seconds, final_window_mean, run_shape
from sweeps.runner import EXIT_FAILED, EXIT_REFUSED, SweepRunner

TUNE_KEYS = ("n_trials", "metric", "direction", "search", "enqueue", "sampler", "pruner", "retries", "final_window",
             "tune_lr")
LR_SEARCH = {"name": "trainer.lr", "type": "float", "low": 1.0e-5, "high": 1.0e-3, "log": True}
DEFAULT_LR = 1.0e-4
PARAM_TYPES = ("float", "int", "categorical")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
STUDY_FILE = "optuna.db"


class TrialFailed(Exception):
    """A run of the trial failed; the trial is marked failed and the study goes on."""


@dataclasses.dataclass(frozen=True)
class SearchParam:
    """One searched value: ``name`` is ``alpha`` (the actuator's alpha) or a train override key (``trainer.lr``)."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        where = f"search.{self.name}"
        check_choice(f"{where}.type", self.type, PARAM_TYPES)
        if self.type == "categorical":
            if not self.choices:
                raise ConfigError(f"{where}.choices = [] is not allowed: a categorical parameter needs choices")
            return
        for bound in ("low", "high"):
            value = getattr(self, bound)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{where}.{bound} = {value!r} is not allowed: it must be a finite number")
        if not self.low < self.high:  # type: ignore[operator]
            raise ConfigError(f"{where}.low = {self.low!r} is not allowed: it must be < high = {self.high!r}")
        if self.log and self.low <= 0:  # type: ignore[operator]
            raise ConfigError(f"{where}.low = {self.low!r} is not allowed with log: true: it must be > 0")

    def suggest(self, trial: Any) -> Any:
        """This parameter's value for ``trial`` (``suggest_float``, ``suggest_int`` or ``suggest_categorical``)."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log,
                                     step=int(self.step or 1))
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log, step=self.step)


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """A study: the sweep settings its runs use (``sweep``) and the search (``conf/sweeps/optuna.yaml``)."""

    sweep: SweepConfig
    n_trials: int
    metric: str
    direction: str
    search: tuple[SearchParam, ...]
    enqueue: tuple[Mapping[str, Any], ...]
    sampler: Mapping[str, Any]
    pruner: Mapping[str, Any]
    retries: int
    final_window: int = 5


def parse_tune_config(cfg: Any) -> TuneConfig:
    """Validate a composed ``optuna.yaml`` into a :class:`TuneConfig`; :class:`ConfigError` naming the key, the
    value and what is allowed."""
    from sweeps.config import parse_sweep_config

    raw = to_plain(cfg)
    sweep = parse_sweep_config(raw, allowed_extra_keys=TUNE_KEYS)
    if sweep.alpha or sweep.mechanisms or sweep.eta:
        raise ConfigError("alpha/mechanisms/eta grids are not allowed in a study: list alpha under search: (set "
                          "alpha=[]) and pick a preset with extra=[dataflex=<preset>]")
    if sweep.extra_axes:
        raise ConfigError(f"extra = {list(sweep.extra)!r} is not allowed: a study has no grid axes; list the "
                          f"parameter under search: instead")
    if sweep.target_mde is not None:
        raise ConfigError(f"target_mde = {sweep.target_mde!r} is not allowed in a study: a study runs the given seeds "
                          f"per trial and plans none; plan seeds with python -m sweeps target_mde=...")
    search = []
    items = list(raw.get("search") or [])
    enqueue_items = [dict(item) for item in raw.get("enqueue") or []]
    if raw.get("tune_lr") and not any(isinstance(i, Mapping) and i.get("name") == LR_SEARCH["name"] for i in items):
        items.append(dict(LR_SEARCH))  # opt-in: lr with alpha (every enqueued trial starts at the default lr)
        enqueue_items = [{**item, LR_SEARCH["name"]: DEFAULT_LR} for item in enqueue_items]
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"search[{index}] = {item!r} is not allowed: write {{name: alpha, type: float, "
                              f"low: 0.0, high: 1.0}}")
        allowed = [field.name for field in dataclasses.fields(SearchParam)]
        unknown = unknown_keys(item, allowed)
        if unknown:
            raise ConfigError(f"search[{index}].{unknown[0]} is not allowed; allowed keys: {', '.join(allowed)}")
        values = dict(item)
        values["choices"] = tuple(values.get("choices") or ())
        search.append(SearchParam(**values))
    if not search:
        raise ConfigError("search = [] is not allowed: list at least one parameter, e.g. {name: alpha, type: float, "
                          "low: 0.0, high: 1.0}")
    names = [param.name for param in search]
    enqueue = tuple(enqueue_items)
    for item in enqueue:
        unknown = unknown_keys(item, names)
        if unknown:
            raise ConfigError(f"enqueue = {item!r} is not allowed: {unknown[0]!r} is not searched; "
                              f"searched: {', '.join(names)}")
    sampler = dict(raw.get("sampler") or {"name": "tpe"})
    pruner = dict(raw.get("pruner") or {"name": "median"})
    check_choice("sampler.name", sampler.get("name"), SAMPLERS)
    check_choice("pruner.name", pruner.get("name"), PRUNERS)
    return TuneConfig(
        sweep=sweep, n_trials=check_int_at_least("n_trials", raw.get("n_trials"), 1),
        metric=(check_metric_key("metric", raw.get("metric") or keys.VAL_ACCURACY) if sweep.backend == "local"
                else str(raw.get("metric") or keys.VAL_ACCURACY)),
        direction=check_choice("direction", raw.get("direction", "maximize"), ("maximize", "minimize")),
        search=tuple(search), enqueue=enqueue, sampler=sampler, pruner=pruner,
        retries=check_int_at_least("retries", raw.get("retries", 1), 0),
        final_window=check_int_at_least("final_window", raw.get("final_window", 5), 1),
    )


def build_sampler(settings: Mapping[str, Any]) -> Any:
    """The Optuna sampler named by ``sampler.name`` (tpe | random), its other keys as arguments."""
    import optuna

    options = {key: value for key, value in settings.items() if key != "name"}
    if settings["name"] == "random":
        return optuna.samplers.RandomSampler(**options)
    return optuna.samplers.TPESampler(**options)


def build_pruner(settings: Mapping[str, Any]) -> Any:
    """The Optuna pruner named by ``pruner.name`` (median | none), its other keys as MedianPruner's arguments."""
    import optuna

    options = {key: value for key, value in settings.items() if key != "name"}
    if settings["name"] == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(**options)


def trial_specs(tune: TuneConfig, params: Mapping[str, Any], label: str) -> list[RunSpec]:
    """One run per seed: ``<label>-s<seed>``, the trial's parameters and the seed as the run's axes."""
    axes = [Axis("alpha", ALPHA_KEY, (float(params["alpha"]),), "++")] if params.get("alpha") is not None else []
    axes += [Axis(name, name, (hydra_value(value),)) for name, value in params.items() if name != "alpha"]
    specs = []
    for seed in tune.sweep.seeds:
        run_axes = (*axes, Axis("seed", "seed", (seed,)))
        specs.append(RunSpec(name=f"{label}-s{seed}", factors={axis.name: axis.values[0] for axis in run_axes},
                             axes=run_axes, axis_keys=tuple(axis.key for axis in run_axes),
                             warm_start_seed=warm_start_seed(tune.sweep.warm_start, seed)))
    return specs


def read_curve(run_dir: Path, metric: str) -> dict[int, float]:
    """step -> value of ``metric`` while a run trains (the run store's reader; finite values only)."""
    from dataflex_rl.tracking import run_store

    curve = run_store.read_curve(run_dir, metric)
    return {int(step): float(value) for step, value in curve.items()}


class TrialReporter:
    """Reports the seed-mean of ``metric`` at every step all of a trial's runs have reached; says when to prune."""

    def __init__(self, trial: Any, runs: Sequence[PlannedRun], metric: str) -> None:
        self.trial = trial
        self.runs = runs
        self.metric = metric
        self.reported: set[int] = set()
        self.pruned = False

    def report_new_steps(self) -> None:
        """``trial.report`` the seed mean at every step all runs have logged since the last call."""
        curves = [read_curve(run.run_dir, self.metric) for run in self.runs]
        common = set.intersection(*(set(curve) for curve in curves)) if curves else set()
        for step in sorted(common - self.reported):
            self.trial.report(sum(curve[step] for curve in curves) / len(curves), step)
            self.reported.add(step)

    def __call__(self, active: Sequence[Job]) -> bool:
        """SweepRunner's ``on_poll``: True stops the trial's runs."""
        before = len(self.reported)
        self.report_new_steps()
        self.pruned = len(self.reported) > before and self.trial.should_prune()
        return self.pruned


def recover_trials(study: Any, retries: int) -> list[int]:
    """Mark trials left RUNNING by a dead driver as failed, then queue failed trials again (same parameters, same
    run folders) up to ``retries`` times. Returns the trial numbers queued again."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
    groups: dict[int, list[Any]] = {}
    for trial in study.get_trials(deepcopy=False):
        groups.setdefault(int(trial.user_attrs.get("retry_of", trial.number)), []).append(trial)
    queued = []
    for root, trials in sorted(groups.items()):
        if all(trial.state == TrialState.FAIL for trial in trials) and len(trials) <= retries:
            study.enqueue_trial(dict(trials[-1].params), user_attrs={"retry_of": root})
            queued.append(root)
    return queued


def print_trials(study: Any, tune: TuneConfig) -> None:
    """A rich table of every trial (state, seed-mean metric, parameters, last step, duration), then the best."""
    from optuna.trial import TrialState
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"study {study.study_name}", title_justify="left")
    for title in ("trial", "state", f"{tune.metric} (seed mean)", *(param.name for param in tune.search),
                  "last step", "duration"):
        table.add_column(title)
    for trial in study.get_trials(deepcopy=False):
        duration = trial.duration.total_seconds() if trial.duration else None
        last_step = trial.last_step
        table.add_row(str(trial.number) + (f" (retry of {trial.user_attrs['retry_of']})"
                                           if "retry_of" in trial.user_attrs else ""),
                      trial.state.name.lower(), "-" if trial.value is None else f"{trial.value:.4f}",
                      *[_format_param(trial.params.get(param.name)) for param in tune.search],
                      "-" if last_step is None else str(last_step), "-" if duration is None else f"{duration:.1f} s")
    console.print(table)
    complete = [trial for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if complete:
        best = study.best_trial
        console.print(f"best trial {best.number}: {tune.metric} = {best.value:.4f} with "
                      + ", ".join(f"{name} = {_format_param(value)}" for name, value in best.params.items()))
    else:
        console.print("no completed trial yet")


def _format_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def study_estimate(tune: TuneConfig, trials: int, jobs: int) -> str:
    """The estimate printed before a study starts: ``trials`` trials one after the other, each running its seeds
    ``jobs`` at once (pruned trials end sooner: an upper bound)."""
    steps, val_items, evaluations = run_shape(tune.sweep)
    per_trial = estimate_seconds(len(tune.sweep.seeds), steps, jobs, val_items=val_items, evaluations=evaluations)
    return describe_estimate(trials * per_trial, f"{trials} trial(s) x {len(tune.sweep.seeds)} seed(s) x {steps} steps")


def study_name(tune: TuneConfig) -> str:
    """``name``, else ``tune-<hash>`` (``tune-lr-<hash>`` when lr is searched: its own study per search space)."""
    searches_lr = any(param.name == LR_SEARCH["name"] for param in tune.search)
    return tune.sweep.name or default_name(tune.sweep, prefix="tune-lr" if searches_lr else "tune")


def first_trial_params(tune: TuneConfig) -> dict[str, Any]:
    """The parameters at their lower bounds (a categorical's first choice): the dry run's trial."""
    return {param.name: (param.choices[0] if param.type == "categorical" else
                         (int(param.low) if param.type == "int" else float(param.low))) for param in tune.search}


def checked_trials(tune: TuneConfig) -> list[tuple[str, dict[str, Any]]]:
    """(where, parameters) of every trial validated before the study starts: the lower bounds, each parameter's
    upper bound and each categorical choice (the others at their lower bounds), and every enqueued trial."""
    lower = first_trial_params(tune)
    trials = [("the lower bounds", lower)]
    for param in tune.search:
        if param.type == "categorical":
            values = [(f"search.{param.name}.choices[{index}]", choice) for index, choice in enumerate(param.choices)]
        else:
            values = [(f"search.{param.name}.high", int(param.high) if param.type == "int" else float(param.high))]
        trials += [(where, {**lower, param.name: value}) for where, value in values]
    trials += [(f"enqueue[{index}] = {dict(item)}", {**lower, **item}) for index, item in enumerate(tune.enqueue)]
    return trials


def plan_study(tune: TuneConfig) -> SweepPlan:
    """The study's plan: its folder, concurrency and shared warm starts, after validating the runs of a first trial
    (:func:`first_trial_params`); raises :class:`ConfigError` naming the first bad value. Trials plan their own
    runs as they come."""
    config = tune.sweep
    name = study_name(tune)
    sweep_dir = Path(config.root) / name
    jobs, threads = concurrency(config, len(config.seeds))
    plan_runs(config, trial_specs(tune, first_trial_params(tune), "t000"), name, sweep_dir, threads)
    for where, params in checked_trials(tune)[1:]:  # one seed each: the seeds differ only in seed=
        try:
            plan_runs(config, trial_specs(tune, params, "t000")[:1], name, sweep_dir, threads)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
    warm_starts = plan_warm_starts(config, trial_specs(tune, {}, "t000"), sweep_dir,
                                   warm_start_threads(config, threads))
    return SweepPlan(name=name, sweep_dir=sweep_dir, config=config, jobs=jobs, threads=threads,
                     warm_starts=warm_starts, runs=[])


def print_study_dry_run(tune: TuneConfig, plan: SweepPlan) -> None:
    """The first trial's command lines and the study's estimate (``dry_run=true``: nothing is started)."""
    runs = plan_runs(plan.config, trial_specs(tune, first_trial_params(tune), "t000"), plan.name, plan.sweep_dir,
                     plan.threads)
    for run in runs:
        print(f"# {run.name} (trial 0 with the lower bounds)\n{run.shell_line()}")
    print(study_estimate(tune, tune.n_trials, plan.jobs))


def study_storage(plan: SweepPlan) -> str:
    """The study's sqlite URL, ``<study folder>/optuna.db``."""
    return f"sqlite:///{(plan.sweep_dir / STUDY_FILE).resolve()}"


def study_header(tune: TuneConfig, plan: SweepPlan) -> dict[str, Any]:
    """The study's sweep.json header: the search instead of a grid."""
    config = tune.sweep
    return {"sweep": plan.name, "backend": config.backend, "launcher": config.launcher,
            "warm_start": config.warm_start, "study": {"storage": study_storage(plan), "n_trials": tune.n_trials, "metric": tune.metric,
                      "direction": tune.direction, "search": [dataclasses.asdict(p) for p in tune.search]},
            "jobs": plan.jobs, "threads": plan.threads, "train_module": config.train_module}


def open_study(tune: TuneConfig, plan: SweepPlan) -> tuple[Any, int]:
    """(the study, trials still to run): created or loaded from its storage, the enqueued trials added to a new
    one, failed trials queued again (:func:`recover_trials`); prints where it stands and the estimate."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=plan.name, storage=study_storage(plan), direction=tune.direction,
                                sampler=build_sampler(tune.sampler), pruner=build_pruner(tune.pruner),
                                load_if_exists=True)
    if not study.get_trials(deepcopy=False):
        for params in tune.enqueue:
            study.enqueue_trial(dict(params))
    queued = recover_trials(study, tune.retries)
    finished = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    remaining = max(0, tune.n_trials - finished)
    print(f"study {plan.name}: {finished} trial(s) finished, {remaining} to run"
          + (f" ({len(queued)} failed trial(s) queued again)" if queued else "")
          + f"; {len(tune.sweep.seeds)} seed(s) per trial, {plan.jobs} run(s) at once; folder {plan.sweep_dir}",
          flush=True)
    if remaining:
        print(study_estimate(tune, remaining, plan.jobs), flush=True)
    return study, remaining


class TrialObjective:
    """Optuna's objective: run a trial's seeds through the session's runner, report their curves for pruning,
    return the seed mean of the final-window ``metric``. Failed trials are listed in ``failed_trials``."""

    def __init__(self, tune: TuneConfig, plan: SweepPlan, runner: SweepRunner) -> None:
        self.tune = tune
        self.plan = plan
        self.runner = runner
        self.failed_trials: list[int] = []

    def _fail(self, trial: Any, message: str) -> TrialFailed:
        self.failed_trials.append(trial.number)
        return TrialFailed(message)

    def __call__(self, trial: Any) -> float:
        """One trial (a retry reuses the run folders of the trial it retries, so its runs resume)."""
        import optuna

        tune, plan = self.tune, self.plan
        params = {param.name: param.suggest(trial) for param in tune.search}
        root = int(trial.user_attrs.get("retry_of", trial.number))
        runs = plan_runs(tune.sweep, trial_specs(tune, params, f"t{root:03d}"), plan.name, plan.sweep_dir,
                         plan.threads)
        trial.set_user_attr("runs", [run.name for run in runs])
        reporter = TrialReporter(trial, runs, tune.metric)
        states = self.runner.run_all(self.runner.pending_runs(runs), on_poll=reporter)
        if reporter.pruned:
            self.runner.say(f"trial {trial.number} pruned at step {max(reporter.reported, default=0)}")
            raise optuna.TrialPruned()
        failed = [run for run, state in states.items() if state != "completed"]
        if failed:
            raise self._fail(trial, f"run(s) {', '.join(failed)} failed; see {plan.sweep_dir / 'logs'}")
        reporter.report_new_steps()
        values = [final_window_mean(run.run_dir, tune.metric, tune.final_window) for run in runs]
        missing = [run.name for run, value in zip(runs, values, strict=True) if value is None]
        if missing:
            raise self._fail(trial, f"no {tune.metric} in the run store of {', '.join(missing)}")
        trial.set_user_attr("per_seed", dict(zip([run.name for run in runs], values, strict=True)))
        return sum(values) / len(values)  # type: ignore[arg-type]


def _optimize(tune: TuneConfig, session: SweepSession, study: Any, remaining: int) -> int:
    """The warm start, then ``remaining`` trials; 0, or EXIT_FAILED when the warm start or a trial failed."""
    if not remaining:
        return 0
    if not session.warm_start():
        return EXIT_FAILED
    objective = TrialObjective(tune, session.plan, session.runner)
    study.optimize(objective, n_trials=remaining, catch=(TrialFailed,))
    return EXIT_FAILED if objective.failed_trials else 0


def run_study(tune: TuneConfig, argv: Sequence[str] = ()) -> int:
    """The whole study in a :class:`~sweeps.driver.SweepSession` (lock, sweep.json, invocation record, warm
    start); returns the exit status (0, 1 when a trial failed, 2 refused, 128+n stopped)."""
    try:
        plan = plan_study(tune)
    except ConfigError as error:
        print(f"error: study refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if tune.sweep.dry_run:
        print_study_dry_run(tune, plan)
        return 0
    try:
        with SweepSession(plan, argv, header=study_header(tune, plan), kind="study") as session:
            study, remaining = open_study(tune, plan)
            session.run(lambda runner: _optimize(tune, session, study, remaining))
    except (SessionRefused, ConfigError) as error:  # ConfigError: a trial's run still alive from an earlier driver
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print_trials(study, tune)
    print(f"study folder: {plan.sweep_dir}; dashboard: optuna-dashboard {study_storage(plan)}", flush=True)
    return session.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0, 1 when a trial failed, 2 refused, 128+n stopped)."""
    from omegaconf import OmegaConf

    from sweeps.cli import help_text, load_config, split_cfg_flag

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(__doc__), end="")
        return 0
    show_config, argv = split_cfg_flag(argv)
    try:
        cfg, _ = load_config(argv, config_name="optuna", allowed_extra_keys=TUNE_KEYS)
        tune = parse_tune_config(cfg)
    except ConfigError as error:
        print(f"error: study refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if show_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    return run_study(tune, argv)


if __name__ == "__main__":
    sys.exit(main())
