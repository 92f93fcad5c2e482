"""Mechanism histograms to the W&B run verl opened.

verl's ``Tracking`` loggers take scalars only, so the trainer logs the weight and token-probability histograms
to W&B itself, into the run verl's ``Tracking`` started in the same process (``wandb.run``). That run's group and
tags come from W&B's environment variables (``WANDB_RUN_GROUP``, ``WANDB_TAGS``; verl passes ``WANDB_ENTITY``
itself), which Ray's workers inherit from the launching shell on a local cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

from dataflex_rl.metrics import Histogram

BACKEND_TAG = "verl"


class WandbHistogramLogger:
    """Logs ``name -> Histogram`` at verl's global step into the current W&B run; tags it once with the mechanism.

    Logging at the step verl is about to log its scalars at keeps both in one W&B row (W&B merges the calls of a
    step until a later step is logged).
    """

    def __init__(self, mechanism_name: str) -> None:
        self.tags = (BACKEND_TAG, mechanism_name)
        self._tagged_run_id: str | None = None

    def log(self, step: int, histograms: Mapping[str, Histogram]) -> None:
        """Log ``histograms`` at ``step`` into the current W&B run (nothing without a run or histograms)."""
        import wandb

        run = wandb.run
        if run is None or not histograms:
            return
        if self._tagged_run_id != run.id:
            run.tags = tuple(dict.fromkeys([*(run.tags or ()), *self.tags]))
            self._tagged_run_id = run.id
        # W&B's np_histogram takes (counts, edges), like numpy.histogram returns them.
        payload = {
            name: wandb.Histogram(np_histogram=(hist.counts.tolist(), hist.edges.tolist()))
            for name, hist in histograms.items()
        }
        wandb.log(payload, step=step)
