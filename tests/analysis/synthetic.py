"""Synthetic run stores and curve tables with a known truth, for the tests and the analysis benchmark.

:func:`write_fake_run` writes one run folder from explicit arrays (every aggregate can be hand-computed);
:func:`write_fake_sweep` a whole sweep; the ``simulate_*`` functions measure the curve intervals' coverage.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from analysis.curves import aggregate_curves, curve_differences
from analysis.statistics import DEFAULT_CONFIDENCE, RandomState
from dataflex_rl import keys
from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.identity import RunIdentity, config_hash
from dataflex_rl.tracking.run_store import CLOSE_STATES, COMPLETED, FAILED, INTERRUPTED, PENDING, RUNNING, RunStore

MetricsFormat = Literal["parquet", "jsonl", "both"]
METRICS_FORMATS: tuple[str, ...] = ("parquet", "jsonl", "both")
FAKE_GIT_COMMIT = "0123456789abcdef0123456789abcdef01234567"
FAKE_START_TIME = "2025-01-01T00:00:00.000+00:00"
# Probability buckets of the gradient statistics, as the training side labels them (``keys.bucket_label``).
FAKE_BUCKETS: tuple[tuple[float, float], ...] = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))


def run_name(sweep: str, alpha: float, seed: int) -> str:
    """The run name the project uses: ``<sweep>-a<alpha>-s<seed>`` (alpha in ``%g`` form)."""
    return f"{sweep}-a{alpha:g}-s{seed}"


def write_fake_run(
    run_dir: str | os.PathLike[str],
    *,
    metrics: Mapping[str, Sequence[float] | np.ndarray],
    steps: Sequence[int] | np.ndarray | None = None,
    sweep: str = "fake-sweep",
    run: str | None = None,
    backend: str = "local",
    mechanism: str = "reweight",
    mechanism_label: str | None = None,
    alpha: float | None = 0.0,
    seed: int | None = 0,
    state: str = COMPLETED,
    error: str | None = None,
    metrics_format: MetricsFormat = "parquet",
    histograms: Sequence[Mapping[str, Any]] | None = None,
    config: Mapping[str, Any] | None = None,
    wall_time_s: float = 60.0,
    git_commit: str = FAKE_GIT_COMMIT,
    axes: Mapping[str, Any] | None = None,
) -> Path:
    """Write one run folder and return its path.

    ``metrics`` maps a metric key to an array of shape ``(n_steps,)`` aligned with ``steps`` (default
    ``0 .. n_steps-1``); NaN means "not logged at that step" (e.g. ``val/accuracy`` between evaluations).
    ``metrics_format``: ``parquet`` writes ``metrics.parquet`` only (a compacted run), ``jsonl`` writes
    ``metrics.jsonl`` only (a run still going, or one that crashed before compaction), ``both`` writes both.
    ``histograms``: dicts ``{"step", "name", "edges" (k+1,), "counts" (k,)}``, written to ``histograms.parquet``
    (or ``histograms.jsonl`` when ``metrics_format == "jsonl"``). ``axes``: the run's grid axes as ``meta.json``
    records them (``{"alpha": 0.5, "trainer.lr": 1e-4, "seed": 1}``); None writes a store with no axes (a run outside
    a grid).
    """
    if metrics_format not in METRICS_FORMATS:
        raise ValueError(f"metrics_format={metrics_format!r} is not one of {METRICS_FORMATS}")
    if state not in run_store.STATES:
        raise ValueError(f"state={state!r} is not one of {run_store.STATES}")
    run_dir = Path(run_dir)
    columns, step_array = _metric_columns(metrics, steps)
    run = run or (run_name(sweep, alpha, seed) if alpha is not None and seed is not None else run_dir.name)
    resolved_config = dict(config) if config is not None else _default_config(
        seed=seed, backend=backend, mechanism=mechanism, alpha=alpha, step_array=step_array)
    # Written through the run store's own writer, so the fake is exactly the format analysis reads.
    store = RunStore(run_dir)
    store.write_config(resolved_config)
    identity = RunIdentity(sweep=sweep, run=run, backend=backend, mechanism=mechanism,
                           alpha=0.0 if alpha is None else alpha, seed=0 if seed is None else seed,
                           config_hash=config_hash(resolved_config), git_commit=git_commit, axes=axes or {})
    _write_meta(store, identity, mechanism_label=mechanism_label, alpha=alpha, seed=seed)
    store.set_status(RUNNING, step=0)
    for row_index, step in enumerate(step_array):
        store.log_metrics(int(step), {k: float(v[row_index]) for k, v in columns.items() if np.isfinite(v[row_index])})
    for record in histograms or ():
        store.log_histogram(int(record["step"]), str(record["name"]), record["edges"], record["counts"])
    last_step = int(step_array[-1]) if len(step_array) else 0
    _finish(store, state=state, error=error, metrics_format=metrics_format, last_step=last_step,
            wall_time_s=wall_time_s, keep_histograms=bool(histograms))
    return run_dir


def _metric_columns(metrics: Mapping[str, Sequence[float] | np.ndarray], steps: Sequence[int] | np.ndarray | None
                    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({key: (n_steps,) float64}, steps (n_steps,) int64)``; ``steps`` default ``0 .. n_steps-1``. Raises when a
    metric does not have one value per step."""
    columns = {key: np.asarray(values, dtype=np.float64) for key, values in metrics.items()}
    lengths = {key: column.shape for key, column in columns.items()}
    n_steps = next(iter(lengths.values()))[0] if columns else (0 if steps is None else len(steps))
    step_array = np.arange(n_steps, dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    for key, shape in lengths.items():
        if shape != step_array.shape:
            raise ValueError(f"metric {key!r} has shape {shape}, expected {step_array.shape} (one value per step)")
    return columns, step_array


def _default_config(*, seed: int | None, backend: str, mechanism: str, alpha: float | None,
                    step_array: np.ndarray) -> dict[str, Any]:
    """The resolved config of a fake run: the keys analysis reads (seed, backend, the mechanism, steps, lr)."""
    return {
        "seed": seed,
        "backend": backend,
        "dataflex": {
            "mechanism": mechanism,
            "scorer": {"name": "token_prob", "params": {}},
            "actuator": {"name": "advantage_reweight", "params": {"alpha": alpha}},
            "warmup_step": 0,
        },
        "trainer": {"total_steps": int(step_array[-1]) + 1 if len(step_array) else 0, "lr": 1.0e-5},
    }


def _write_meta(store: RunStore, identity: RunIdentity, *, mechanism_label: str | None, alpha: float | None,
                seed: int | None) -> None:
    """``meta.json`` of ``identity`` (plus the preset label); alpha or seed None: written as null, as a run whose
    identity lacks them (analysis then reads them from ``sweep.json`` or the run name)."""
    extra: dict[str, Any] = {"mechanism_label": mechanism_label} if mechanism_label is not None else {}
    meta = store.write_meta(identity, extra=extra, now=FAKE_START_TIME)
    if alpha is None or seed is None:
        meta.update({key: None for key, value in (("alpha", alpha), ("seed", seed)) if value is None})
        run_store.atomic_write_json(store.path(run_store.META_FILE), meta)


def _finish(store: RunStore, *, state: str, error: str | None, metrics_format: MetricsFormat, last_step: int,
            wall_time_s: float, keep_histograms: bool) -> None:
    """End the run in ``state`` as the trainer would, then leave the files ``metrics_format`` names."""
    if metrics_format == "jsonl":  # a run still going, or one that crashed before compaction
        store.set_status(state, step=last_step, error=error,
                         traceback=f"Traceback (most recent call last):\n{error}" if error else None)
        store.detach()
        return
    if state in (FAILED, INTERRUPTED) and error:
        store.record_error(state, error, traceback=f"Traceback (most recent call last):\n{error}")
    close_state = state if state in CLOSE_STATES else COMPLETED
    store.close(close_state, end_time=_plus_seconds(FAKE_START_TIME, wall_time_s))
    if state not in CLOSE_STATES:
        store.set_status(state, step=last_step, error=error)
    if metrics_format == "parquet":  # a compacted run whose jsonl files were cleaned away
        for name in (run_store.METRICS_JSONL, run_store.HISTOGRAMS_JSONL):
            store.path(name).unlink(missing_ok=True)
        if not keep_histograms:
            store.path(run_store.HISTOGRAMS_PARQUET).unlink(missing_ok=True)


def _plus_seconds(iso: str, seconds: float) -> str:
    start = datetime.datetime.fromisoformat(iso)
    return (start + datetime.timedelta(seconds=float(seconds))).isoformat(timespec="milliseconds")


def fake_metrics(
    alpha: float,
    seed: int,
    n_steps: int,
    *,
    eval_every: int = 5,
    grad_stats: bool = True,
    random_state: int | np.random.Generator | None = 0,
) -> dict[str, np.ndarray]:
    """Plausible training curves of shape ``(n_steps,)`` per key; accuracy rises faster with larger ``alpha``.

    ``val/accuracy`` is logged every ``eval_every`` steps and at the last step (NaN elsewhere).
    """
    rng = np.random.default_rng(random_state)
    progress = np.arange(n_steps, dtype=np.float64) / max(n_steps - 1, 1)
    ceiling = 0.55 + 0.2 * alpha + 0.02 * (seed % 3)
    learning = ceiling * (1.0 - np.exp(-4.0 * progress))
    val_accuracy = np.clip(learning + rng.normal(0.0, 0.02, n_steps), 0.0, 1.0)
    logged = np.zeros(n_steps, dtype=bool)
    logged[::eval_every] = True
    logged[-1] = True
    val_accuracy[~logged] = np.nan
    low_fraction = np.clip(0.3 * np.exp(-2.0 * progress) + 0.05 * alpha + rng.normal(0, 0.01, n_steps), 0, 1)
    result: dict[str, np.ndarray] = {
        keys.VAL_ACCURACY: val_accuracy,
        keys.SCORE_MEAN: np.clip(learning + rng.normal(0.0, 0.05, n_steps), 0.0, 1.0),
        keys.TRAIN_ACCURACY: np.clip(learning + rng.normal(0.0, 0.04, n_steps), 0.0, 1.0),
        keys.RESPONSE_LENGTH_MEAN: 100.0 + 20.0 * progress + rng.normal(0.0, 2.0, n_steps),
        keys.TOKEN_PROB_LOW_FRAC: low_fraction,
        keys.TOKEN_PROB_MEAN: 1.0 - low_fraction,
        keys.GRAD_NORM: 1.0 + 0.2 * rng.standard_normal(n_steps) ** 2,
        f"{keys.WEIGHT_PREFIX}/mean": np.ones(n_steps),
        f"{keys.WEIGHT_PREFIX}/std": alpha * (0.3 + 0.05 * rng.standard_normal(n_steps) ** 2),
    }
    if grad_stats:
        raw = np.array([0.4 - 0.25 * alpha, 0.25, 0.2, 0.15 + 0.1 * alpha])
        for stat in ("logit_grad_norm_share", "param_grad_share", "token_share", "logit_grad_bound"):
            share = raw[None, :] * np.exp(rng.normal(0.0, 0.05, (n_steps, len(raw))))
            share /= share.sum(axis=1, keepdims=True)
            for bucket_index, (low, high) in enumerate(FAKE_BUCKETS):
                label = keys.bucket_label(low, high)
                result[keys.grad_by_prob(label, stat)] = share[:, bucket_index]
        result[keys.GRAD_LOW_PROB_SHARE] = (
            result[keys.grad_by_prob(keys.bucket_label(*FAKE_BUCKETS[0]), "logit_grad_norm_share")]
            + result[keys.grad_by_prob(keys.bucket_label(*FAKE_BUCKETS[1]), "logit_grad_norm_share")]
        )
    return result


def fake_histograms(
    alpha: float, steps: Sequence[int], *, bins: int = 20, random_state: int | np.random.Generator | None = 0
) -> list[dict[str, Any]]:
    """Weight and token-probability histograms at each of ``steps`` (edges ``(bins+1,)``, counts ``(bins,)``)."""
    rng = np.random.default_rng(random_state)
    records: list[dict[str, Any]] = []
    for step in steps:
        probabilities = rng.beta(2.0 + step * 0.05, 1.0, size=500)
        weights = alpha * probabilities + (1.0 - alpha)
        weights = weights / weights.mean()
        for name, sample in ((keys.HIST_TOKEN_PROB, probabilities), (keys.HIST_WEIGHT, weights)):
            # alpha = 0 gives weights all equal to 1: widen the range so the single value lands inside it.
            low, high = (0.0, 1.0) if name == keys.HIST_TOKEN_PROB else (float(sample.min()) - 1e-3,
                                                                        float(sample.max()) + 1e-3)
            counts, edges = np.histogram(sample, bins=bins, range=(low, high))
            records.append({"step": int(step), "name": name, "edges": edges, "counts": counts})
    return records


def write_fake_sweep(
    sweep_dir: str | os.PathLike[str],
    *,
    alphas: Sequence[float] = (0.0, 0.5, 1.0),
    seeds: Sequence[int] = (1, 2, 3),
    n_steps: int = 40,
    eval_every: int = 5,
    failed: Sequence[tuple[float, int]] = (),
    running: Sequence[tuple[float, int]] = (),
    pending: Sequence[tuple[float, int]] = (),
    histograms: bool = True,
    grad_stats: bool = True,
    histogram_every: int = 10,
    mechanism_label: str | None = None,
    write_manifest: bool = True,
    random_state: int = 0,
) -> Path:
    """Write a sweep folder: one run per ``alpha x seed`` plus ``sweep.json``; return the folder.

    ``failed`` runs stop half way with state ``failed``, an error message and only ``metrics.jsonl`` (crashed before
    compaction); ``running`` runs stop half way with state ``running`` and only ``metrics.jsonl``; ``pending`` runs get
    no folder at all, only a ``sweep.json`` entry.
    """
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    sweep = sweep_dir.name
    manifest_runs: list[dict[str, Any]] = []
    for alpha in alphas:
        for seed in seeds:
            name = run_name(sweep, alpha, seed)
            if (alpha, seed) in pending:
                manifest_runs.append({"run": name, "state": PENDING, "alpha": alpha, "seed": seed})
                continue
            generator_seed = [random_state, round(alpha * 1000), seed]
            metrics = fake_metrics(alpha, seed, n_steps, eval_every=eval_every, grad_stats=grad_stats,
                                   random_state=np.random.default_rng(generator_seed))
            state, error, metrics_format, length = COMPLETED, None, "parquet", n_steps
            if (alpha, seed) in failed:
                state, error, metrics_format = FAILED, "RuntimeError: loss became NaN at step 20", "jsonl"
                length = n_steps // 2
            elif (alpha, seed) in running:
                state, metrics_format, length = RUNNING, "jsonl", n_steps // 2
            metrics = {key: values[:length] for key, values in metrics.items()}
            records = None
            if histograms:
                records = fake_histograms(alpha, range(0, length, histogram_every),
                                          random_state=np.random.default_rng(generator_seed))
            write_fake_run(
                sweep_dir / name, metrics=metrics, sweep=sweep, run=name, alpha=alpha, seed=seed, state=state,
                error=error, metrics_format=metrics_format, histograms=records, mechanism_label=mechanism_label,
            )
            manifest_runs.append({"run": name, "state": state, "alpha": alpha, "seed": seed})
    if write_manifest:
        grid = {"alpha": list(alphas), "seed": list(seeds)}
        run_store.atomic_write_json(sweep_dir / run_store.SWEEP_FILE,
                                    {"sweep": sweep, "grid": grid, "runs": manifest_runs})
    return sweep_dir


def correlated_curve_table(
    n_seeds: int,
    *,
    n_replicates: int = 1,
    n_steps: int = 8,
    eval_every: int = 10,
    difference: float = 0.02,
    autocorrelation: float = 0.7,
    difference_sd: float = 0.02,
    noise_sd: float = 0.01,
    seed_sd: float = 0.03,
    random_state: int | np.random.Generator | None = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A long table of evaluation curves of two groups with a known paired difference, and that truth.

    ``n_replicates`` independent sweeps (factor column ``replicate``), each of ``n_seeds`` seeds x alpha {0, 0.5},
    evaluated at steps ``0, eval_every, ..., (n_steps - 1) eval_every`` (metric ``val/accuracy``). Seed ``i`` of
    replicate ``r`` at step ``k`` (step index ``k``):

    - baseline ``y_rik = 0.5 + 0.2 (1 - exp(-k / 3)) + u_ri + e_rik``, ``u_ri ~ N(0, seed_sd^2)`` a seed effect shared
      by the seed's two runs (it cancels in the paired difference), ``e_rik ~ N(0, noise_sd^2)``;
    - treatment ``x_rik = y_rik + delta_k + a_rik + f_rik``: the true difference ``delta_k = difference k / (n_steps
      - 1)`` (0 at the start, ``difference`` at the end), a seed's drift ``a_ri.`` that is stationary AR(1) across steps
      (``a_rik = autocorrelation a_ri(k-1) + sqrt(1 - autocorrelation^2) difference_sd z_rik``, sd ``difference_sd``),
      and independent noise ``f_rik ~ N(0, noise_sd^2)``.

    The paired differences ``x - y`` are then normal with mean ``delta_k`` and correlated across steps. Returns
    ``(long, truth)``: the long table (:data:`analysis.frames.LONG_COLUMNS` plus ``replicate``; seeds numbered
    ``0 .. n_seeds - 1`` in every replicate) and ``truth`` with columns ``step, difference``. Every array is drawn at
    once, so thousands of replicates take a fraction of a second.
    """
    if n_seeds < 1 or n_replicates < 1 or n_steps < 1:
        raise ValueError(f"n_seeds={n_seeds!r}, n_replicates={n_replicates!r}, n_steps={n_steps!r} must be positive")
    if not -1.0 < autocorrelation < 1.0:
        raise ValueError(f"autocorrelation={autocorrelation!r} must lie strictly between -1 and 1")
    rng = np.random.default_rng(random_state)
    step_index = np.arange(n_steps, dtype=np.float64)
    true_difference = difference * step_index / max(n_steps - 1, 1)
    shape = (n_replicates, n_seeds, n_steps)
    baseline = (0.5 + 0.2 * (1.0 - np.exp(-step_index / 3.0)) + rng.normal(0.0, seed_sd, shape[:2])[..., None]
                + rng.normal(0.0, noise_sd, shape))
    innovations = rng.standard_normal(shape) * difference_sd
    drift = np.empty(shape)
    drift[..., 0] = innovations[..., 0]
    for k in range(1, n_steps):  # stationary AR(1): variance difference_sd^2 at every step
        drift[..., k] = autocorrelation * drift[..., k - 1] + np.sqrt(1.0 - autocorrelation ** 2) * innovations[..., k]
    treatment = baseline + true_difference + drift + rng.normal(0.0, noise_sd, shape)

    replicate = np.broadcast_to(np.arange(n_replicates)[:, None, None], shape).ravel()
    seed = np.broadcast_to(np.arange(n_seeds)[None, :, None], shape).ravel()
    steps = np.broadcast_to((step_index.astype(np.int64) * eval_every)[None, None, :], shape).ravel()
    runs_per_group = n_replicates * n_seeds
    run_names = np.array([f"sim-{index}" for index in range(2 * runs_per_group)], dtype=object)
    run_of = np.repeat(np.arange(runs_per_group), n_steps)  # one run per (replicate, seed) and group
    frames = []
    for group, (alpha, values) in enumerate(((0.0, baseline), (0.5, treatment))):
        frames.append(pd.DataFrame({
            "sweep": "simulated", "run": run_names[run_of + group * runs_per_group], "backend": "local",
            "mechanism": "reweight", "mechanism_label": "reweight", "alpha": alpha,
            "seed": seed, "replicate": replicate, "step": steps, "metric": keys.VAL_ACCURACY,
            "value": values.ravel()}))
    truth = pd.DataFrame({"step": np.arange(n_steps, dtype=np.int64) * eval_every, "difference": true_difference})
    return pd.concat(frames, ignore_index=True), truth


def simulate_band_coverage(
    n_seeds: int,
    *,
    n_replicates: int = 2000,
    n_steps: int = 8,
    autocorrelation: float = 0.7,
    confidence: float = DEFAULT_CONFIDENCE,
    random_state: RandomState = 0,
) -> dict[str, float]:
    """Coverage of :func:`analysis.curves.curve_differences`' intervals on ``n_replicates`` simulated sweeps with a
    known truth.

    Each replicate is one sweep of ``n_seeds`` seeds x {baseline, treatment} evaluated at ``n_steps`` steps
    (:func:`correlated_curve_table`: paired differences AR(1) across steps with lag-one
    correlation ``autocorrelation``, plus independent noise); all replicates go through one call of
    :func:`curve_differences` (group keys ``replicate, alpha``: each replicate's treatment against its own baseline).

    Returns ``n_seeds, n_steps, n_replicates``; ``pointwise``: the share of (replicate, step) intervals holding the
    true difference (nominal ``confidence``); ``simultaneous``: the share of replicates whose band holds the whole true
    curve (at least ``confidence`` by construction); ``pointwise_simultaneous``: the same for the pointwise intervals
    (why a band is needed); ``band_width_ratio``: band half-width over pointwise half-width.
    """
    long, truth = correlated_curve_table(n_seeds, n_replicates=n_replicates, n_steps=n_steps,
                                         autocorrelation=autocorrelation, random_state=random_state)
    metric = str(long["metric"].iloc[0])
    frame = curve_differences(long, metric, group_keys=("replicate", "alpha"), baseline={"alpha": 0.0},
                              confidence=confidence)
    true_difference = truth.set_index("step")["difference"].reindex(frame["step"]).to_numpy()
    inside_pointwise = ((frame["ci_low"] <= true_difference) & (true_difference <= frame["ci_high"])).to_numpy()
    inside_band = ((frame["band_low"] <= true_difference) & (true_difference <= frame["band_high"])).to_numpy()
    replicate = frame["replicate"].to_numpy()
    if len(frame) != n_replicates * n_steps:
        raise RuntimeError(f"expected {n_replicates * n_steps} compared steps, got {len(frame)}")
    whole_curve = pd.DataFrame({"replicate": replicate, "pointwise": inside_pointwise, "band": inside_band}).groupby(
        "replicate").all()
    return {"n_seeds": int(n_seeds), "n_steps": int(n_steps), "n_replicates": int(n_replicates),
            "pointwise": float(inside_pointwise.mean()), "simultaneous": float(whole_curve["band"].mean()),
            "pointwise_simultaneous": float(whole_curve["pointwise"].mean()),
            "band_width_ratio": float(np.mean((frame["band_high"] - frame["band_low"])
                                              / (frame["ci_high"] - frame["ci_low"])))}


def simulate_curve_interval_coverage(
    n_seeds: int,
    *,
    n_replicates: int = 4000,
    confidence: float = DEFAULT_CONFIDENCE,
    random_state: RandomState = 0,
) -> dict[str, float]:
    """Coverage of :func:`analysis.curves.aggregate_curves`' mean and IQM intervals for normal data.

    One group of ``n_seeds`` runs whose values at each of ``n_replicates`` steps are independent N(0.5, 0.05): each
    step is one replicate, so one vectorised call measures them all. The true mean and IQM are both 0.5 (a symmetric
    distribution). Returns ``n_seeds, n_replicates, mean`` (coverage of the Student-t interval) and ``iqm`` (coverage
    of the Tukey-McLaughlin interval).
    """
    rng = np.random.default_rng(random_state)
    values = rng.normal(0.5, 0.05, size=(n_seeds, n_replicates))
    long = pd.DataFrame({
        "sweep": "simulated", "run": np.repeat([f"s{seed}" for seed in range(n_seeds)], n_replicates),
        "backend": "local", "mechanism": "reweight", "mechanism_label": "reweight", "alpha": 0.0,
        "seed": np.repeat(np.arange(n_seeds), n_replicates), "step": np.tile(np.arange(n_replicates), n_seeds),
        "metric": "simulated", "value": values.ravel()})
    curves = aggregate_curves(long, "simulated", confidence=confidence)
    covered_mean = (curves["ci_low"] <= 0.5) & (0.5 <= curves["ci_high"])
    covered_iqm = (curves["iqm_ci_low"] <= 0.5) & (0.5 <= curves["iqm_ci_high"])
    return {"n_seeds": int(n_seeds), "n_replicates": int(n_replicates), "mean": float(covered_mean.mean()),
            "iqm": float(covered_iqm.mean())}
