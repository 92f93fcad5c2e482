"""``python -m sweeps.tune [key=value ...]`` (``make tune``): an Optuna search over alpha (and ``trainer.lr`` with
``tune_lr=true``), trials pruned on ``val/accuracy``, the study in ``<root>/<name>/optuna.db`` (the same command
resumes it; ``optuna-dashboard sqlite:///runs/<name>/optuna.db`` shows it). docs/sweeps.md describes the search."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore

from analysis.aggregate import DEFAULT_FINAL_WINDOW
from dataflex_rl import keys
from dataflex_rl.keys import ALPHA_KEY
from dataflex_rl.overrides import hydra_value
from dataflex_rl.tracking.run_store import COMPLETED, final_value, read_curve
from dataflex_rl.validation import ConfigError, check_choice, check_int_at_least, check_number, to_plain, unknown_keys
from sweeps.backends import get_backend
from sweeps.sweep_config import Axis, SweepConfig, extra_axes, parse_sweep_config
from sweeps.grid import RunSpec, default_name, warm_start_seed
from sweeps.launchers import Job
from sweeps.plan import PlannedRun, SweepPlan, concurrency
from sweeps.runner import EXIT_FAILED, EXIT_REFUSED, SessionRefused, SweepRunner, SweepSession

# The study's own keys and their defaults (the ConfigStore node tune_schema, which conf/sweeps/optuna.yaml composes).
TUNE_DEFAULTS: dict[str, Any] = {
    "n_trials": 8,  # trials to finish (completed or pruned): about 13 minutes on 2 cores with 2 seeds x 120 steps
    "metric": keys.VAL_ACCURACY,  # its final-window mean, averaged over the trial's seeds, is the objective
    "final_window": DEFAULT_FINAL_WINDOW,
    "direction": "maximize",
    "retries": 1,  # a failed trial is queued again (same parameters, same run folders) this many times
    "search": [{"name": "alpha", "type": "float", "low": 0.0, "high": 1.0}],
    "tune_lr": False,  # true: also search trainer.lr (LR_SEARCH)
    "enqueue": [{"alpha": 0.0}, {"alpha": 0.5}],  # evaluated first, before the sampler proposes anything
    "sampler": {"name": "tpe", "seed": 0},  # tpe | random; other keys are the sampler's arguments
    "pruner": {"name": "median", "n_startup_trials": 3, "n_warmup_steps": 0, "interval_steps": 1},  # median | none
}
TUNE_KEYS = tuple(TUNE_DEFAULTS)
ConfigStore.instance().store(name="tune_schema", node=TUNE_DEFAULTS)
LR_SEARCH = {"name": "trainer.lr", "type": "float", "low": 1.0e-5, "high": 1.0e-3, "log": True}
PARAM_TYPES = ("float", "int", "categorical")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
STUDY_FILE = "optuna.db"


class TrialFailed(Exception):
    """A run of the trial failed; the trial is marked failed and the study goes on."""


@dataclasses.dataclass(frozen=True)
class SearchParam:
    """One searched value: ``alpha`` (the actuator's alpha) or a train override key (``trainer.lr``)."""

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
            check_number(f"{where}.{bound}", getattr(self, bound))
        if not self.low < self.high:  # type: ignore[operator]
            raise ConfigError(f"{where}.low = {self.low!r} is not allowed: it must be < high = {self.high!r}")
        if self.log and self.low <= 0:  # type: ignore[operator]
            raise ConfigError(f"{where}.low = {self.low!r} is not allowed with log: true: it must be > 0")

    def suggest(self, trial: Any) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log,
                                     step=int(self.step or 1))
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log, step=self.step)


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    sweep: SweepConfig
    n_trials: int
    metric: str
    direction: str
    search: tuple[SearchParam, ...]
    enqueue: tuple[Mapping[str, Any], ...]
    sampler: Mapping[str, Any]
    pruner: Mapping[str, Any]
    retries: int
    final_window: int


def parse_tune_config(cfg: Any) -> TuneConfig:
    raw = {**TUNE_DEFAULTS, **to_plain(cfg)}
    sweep = parse_sweep_config(raw, allowed_extra_keys=TUNE_KEYS)
    if sweep.alpha or sweep.mechanisms or sweep.eta:
        raise ConfigError("alpha/mechanisms/eta grids are not allowed in a study: list alpha under search: (set "
                          "alpha=[]) and pick a preset with extra=[dataflex=<preset>]")
    if extra_axes(sweep):
        raise ConfigError(f"extra = {list(sweep.extra)!r} is not allowed: a study has no grid axes; list the "
                          f"parameter under search: instead")
    if sweep.target_mde is not None:
        raise ConfigError(f"target_mde = {sweep.target_mde!r} is not allowed in a study: a study runs the given seeds "
                          f"per trial and plans none; plan seeds with python -m sweeps target_mde=...")
    search = []
    items = list(raw.get("search") or [])
    enqueue_items = [dict(item) for item in raw.get("enqueue") or []]
    if raw.get("tune_lr") and not any(isinstance(i, Mapping) and i.get("name") == LR_SEARCH["name"] for i in items):
        items.append(dict(LR_SEARCH))  # opt-in: lr with alpha (every enqueued trial starts at the trainer's lr)
        start = get_backend(sweep.backend).starting_lr()
        enqueue_items = [{**item, LR_SEARCH["name"]: start} for item in enqueue_items]
    allowed = [field.name for field in dataclasses.fields(SearchParam)]
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"search[{index}] = {item!r} is not allowed: write {{name: alpha, type: float, "
                              f"low: 0.0, high: 1.0}}")
        unknown = unknown_keys(item, allowed)
        if unknown:
            raise ConfigError(f"search[{index}].{unknown[0]} is not allowed; allowed keys: {', '.join(allowed)}")
        search.append(SearchParam(**{**item, "choices": tuple(item.get("choices") or ())}))
    if not search:
        raise ConfigError("search = [] is not allowed: list at least one parameter, e.g. {name: alpha, type: float, "
                          "low: 0.0, high: 1.0}")
    names = [param.name for param in search]
    for item in enqueue_items:
        unknown = unknown_keys(item, names)
        if unknown:
            raise ConfigError(f"enqueue = {item!r} is not allowed: {unknown[0]!r} is not searched; "
                              f"searched: {', '.join(names)}")
    sampler, pruner = dict(raw["sampler"] or {}), dict(raw["pruner"] or {})
    check_choice("sampler.name", sampler.get("name"), SAMPLERS)
    check_choice("pruner.name", pruner.get("name"), PRUNERS)
    return TuneConfig(
        sweep=sweep, n_trials=check_int_at_least("n_trials", raw["n_trials"], 1),
        metric=get_backend(sweep.backend).check_metric("metric", raw["metric"]),
        direction=check_choice("direction", raw["direction"], ("maximize", "minimize")),
        search=tuple(search), enqueue=tuple(enqueue_items), sampler=sampler, pruner=pruner,
        retries=check_int_at_least("retries", raw["retries"], 0),
        final_window=check_int_at_least("final_window", raw["final_window"], 1))


def _build(settings: Mapping[str, Any], classes: Mapping[str, Any]) -> Any:
    return classes[settings["name"]](**{key: value for key, value in settings.items() if key != "name"})


def trial_specs(tune: TuneConfig, params: Mapping[str, Any], label: str) -> list[RunSpec]:
    """One run per seed, ``<label>-s<seed>``, with the trial's parameters and the seed as its axes."""
    axes = [Axis("alpha", ALPHA_KEY, (float(params["alpha"]),), "++")] if params.get("alpha") is not None else []
    axes += [Axis(name, name, (hydra_value(value),)) for name, value in params.items() if name != "alpha"]
    specs = []
    for seed in tune.sweep.seeds:
        run_axes = (*axes, Axis("seed", "seed", (seed,)))
        specs.append(RunSpec(name=f"{label}-s{seed}", factors={axis.name: axis.values[0] for axis in run_axes},
                             axes=run_axes, axis_keys=tuple(axis.key for axis in run_axes),
                             warm_start_seed=warm_start_seed(tune.sweep.warm_start, seed)))
    return specs


class TrialReporter:
    """Reports the seed mean of ``metric`` at each step all of a trial's runs reached; says when to prune."""

    def __init__(self, trial: Any, runs: Sequence[PlannedRun], metric: str) -> None:
        self.trial, self.runs, self.metric = trial, runs, metric
        self.reported: set[int] = set()
        self.pruned = False

    def report_new_steps(self) -> None:
        curves = [{int(step): float(value) for step, value in read_curve(run.run_dir, self.metric).items()}
                  for run in self.runs]
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


def print_trials(study: Any, tune: TuneConfig) -> None:
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
        table.add_row(str(trial.number) + (f" (retry of {trial.user_attrs['retry_of']})"
                                           if "retry_of" in trial.user_attrs else ""),
                      trial.state.name.lower(), "-" if trial.value is None else f"{trial.value:.4f}",
                      *[_format_param(trial.params.get(param.name)) for param in tune.search],
                      "-" if trial.last_step is None else str(trial.last_step),
                      "-" if duration is None else f"{duration:.1f} s")
    console.print(table)
    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        best = study.best_trial
        console.print(f"best trial {best.number}: {tune.metric} = {best.value:.4f} with "
                      + ", ".join(f"{name} = {_format_param(value)}" for name, value in best.params.items()))
    else:
        console.print("no completed trial yet")


def _format_param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)


def study_estimate(tune: TuneConfig, trials: int, jobs: int) -> str:
    estimate = get_backend(tune.sweep.backend).estimate_seconds(tune.sweep, len(tune.sweep.seeds), jobs)
    if estimate is None:
        return f"no estimate of the wall time on backend={tune.sweep.backend}"
    seconds, run, assumed = estimate
    return (f"estimate: about {trials * seconds / 60:.0f} min for {trials} trial(s) x {len(tune.sweep.seeds)} "
            f"seed(s) x {run} on an idle machine ({assumed}); a shared machine is slower")


def final_window_mean(run_dir: Path, key: str, window: int) -> float | None:
    """None when the run logged no ``key`` or its store cannot be read."""
    try:
        return final_value(run_dir, key, window=window)
    except (OSError, ValueError):
        return None


def first_trial_params(tune: TuneConfig) -> dict[str, Any]:
    return {param.name: (param.choices[0] if param.type == "categorical" else
                         (int(param.low) if param.type == "int" else float(param.low))) for param in tune.search}


def plan_study(tune: TuneConfig) -> SweepPlan:
    """Validates the runs of the lower bounds, then (one seed each: the seeds differ only in seed=) of each upper bound
    and categorical choice and each enqueued trial; trials plan their own runs as they come. The study's name:
    ``name``, else ``tune-<hash>`` (``tune-lr-<hash>`` when lr is searched)."""
    config = tune.sweep
    searches_lr = any(param.name == LR_SEARCH["name"] for param in tune.search)
    name = config.name or default_name(config, prefix="tune-lr" if searches_lr else "tune")
    sweep_dir = Path(config.root) / name
    jobs, threads, warm_threads, _ = dataclasses.astuple(concurrency(config, len(config.seeds)))
    backend = get_backend(config.backend)
    lower = first_trial_params(tune)
    backend.plan(config, trial_specs(tune, lower, "t000"), name, sweep_dir, threads)
    checked = []  # (where, parameters)
    for param in tune.search:
        if param.type == "categorical":
            checked += [(f"search.{param.name}.choices[{index}]", {param.name: choice})
                        for index, choice in enumerate(param.choices)]
        else:
            high = int(param.high) if param.type == "int" else float(param.high)
            checked.append((f"search.{param.name}.high", {param.name: high}))
    checked += [(f"enqueue[{index}] = {dict(item)}", item) for index, item in enumerate(tune.enqueue)]
    for where, params in checked:
        try:
            backend.plan(config, trial_specs(tune, {**lower, **params}, "t000")[:1], name, sweep_dir, threads)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
    warm_starts = backend.warm_starts(config, trial_specs(tune, {}, "t000"), sweep_dir, warm_threads)
    return SweepPlan(name=name, sweep_dir=sweep_dir, config=config, jobs=jobs, threads=threads,
                     warm_starts=warm_starts, runs=[])


def study_storage(plan: SweepPlan) -> str:
    return f"sqlite:///{(plan.sweep_dir / STUDY_FILE).resolve()}"


def open_study(tune: TuneConfig, plan: SweepPlan) -> tuple[Any, int]:
    """(the study, trials still to run); enqueues a new study's trials, fails the trials a dead driver left RUNNING
    and queues failed ones again up to ``retries`` times."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = _build(tune.sampler, {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler})
    pruner = _build(tune.pruner, {"median": optuna.pruners.MedianPruner,
                                  "none": lambda **_: optuna.pruners.NopPruner()})
    study = optuna.create_study(study_name=plan.name, storage=study_storage(plan), direction=tune.direction,
                                sampler=sampler, pruner=pruner, load_if_exists=True)
    if not study.get_trials(deepcopy=False):
        for params in tune.enqueue:
            study.enqueue_trial(dict(params))
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):  # a dead driver left it running
        study.tell(trial.number, state=TrialState.FAIL)
    groups: dict[int, list[Any]] = {}  # each trial with its retries
    for trial in study.get_trials(deepcopy=False):
        groups.setdefault(int(trial.user_attrs.get("retry_of", trial.number)), []).append(trial)
    queued = []  # failed ones queued again, up to ``retries`` times
    for root, trials in sorted(groups.items()):
        if all(trial.state == TrialState.FAIL for trial in trials) and len(trials) <= tune.retries:
            study.enqueue_trial(dict(trials[-1].params), user_attrs={"retry_of": root})
            queued.append(root)
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
    """Runs a trial's seeds, reports their curves for pruning, returns the final-window seed mean."""

    def __init__(self, tune: TuneConfig, plan: SweepPlan, runner: SweepRunner) -> None:
        self.tune, self.plan, self.runner = tune, plan, runner
        self.failed_trials: list[int] = []

    def _fail(self, trial: Any, message: str) -> TrialFailed:
        self.failed_trials.append(trial.number)
        return TrialFailed(message)

    def __call__(self, trial: Any) -> float:
        """A retry reuses the run folders of the trial it retries, so its runs resume."""
        import optuna

        tune, plan = self.tune, self.plan
        params = {param.name: param.suggest(trial) for param in tune.search}
        root = int(trial.user_attrs.get("retry_of", trial.number))
        runs = get_backend(tune.sweep.backend).plan(tune.sweep, trial_specs(tune, params, f"t{root:03d}"), plan.name,
                                                    plan.sweep_dir, plan.threads)
        trial.set_user_attr("runs", [run.name for run in runs])
        reporter = TrialReporter(trial, runs, tune.metric)
        states = self.runner.run_all(self.runner.pending_runs(runs), on_poll=reporter)
        if reporter.pruned:
            print(f"trial {trial.number} pruned at step {max(reporter.reported, default=0)}", flush=True)
            raise optuna.TrialPruned()
        failed = [run for run, state in states.items() if state != COMPLETED]
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
    if not session.warm_start():
        return EXIT_FAILED
    objective = TrialObjective(tune, session.plan, session.runner)
    study.optimize(objective, n_trials=remaining, catch=(TrialFailed,))
    return EXIT_FAILED if objective.failed_trials else 0


def run_study(tune: TuneConfig, argv: Sequence[str] = ()) -> int:
    """Returns the exit status (0, 1 when a trial failed, 2 refused, 128+n stopped)."""
    try:
        plan = plan_study(tune)
    except ConfigError as error:
        print(f"error: study refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if tune.sweep.dry_run:
        first = trial_specs(tune, first_trial_params(tune), "t000")
        for run in get_backend(plan.config.backend).plan(plan.config, first, plan.name, plan.sweep_dir, plan.threads):
            print(f"# {run.name} (trial 0 with the lower bounds)\n{run.shell_line()}")
        print(study_estimate(tune, tune.n_trials, plan.jobs))
        return 0
    header = {key: value for key, value in plan.header().items() if key not in ("grid", "steps")}
    header["study"] = {"storage": study_storage(plan), "n_trials": tune.n_trials, "metric": tune.metric,
                       "direction": tune.direction, "search": [dataclasses.asdict(param) for param in tune.search]}
    try:
        with SweepSession(plan, argv, header=header, kind="study") as session:
            study, remaining = open_study(tune, plan)
            if remaining:
                session.run(lambda runner: _optimize(tune, session, study, remaining))
    except (SessionRefused, ConfigError) as error:  # ConfigError: a trial's run still alive from an earlier driver
        print(f"error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    print_trials(study, tune)
    print(f"study folder: {plan.sweep_dir}; dashboard: optuna-dashboard {study_storage(plan)}", flush=True)
    return session.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    from sweeps.cli import main as cli_main

    return cli_main(argv, __doc__, "study", run_study, "optuna", TUNE_KEYS, parse_tune_config)


if __name__ == "__main__":
    sys.exit(main())
