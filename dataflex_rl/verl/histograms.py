"""Mechanism histograms to the W&B run verl opened in this process (verl's loggers take scalars only)."""

from __future__ import annotations

from collections.abc import Mapping

from dataflex_rl.metrics import Histogram

BACKEND_TAG = "verl"


class WandbHistogramLogger:
    def __init__(self, mechanism_name: str) -> None:
        self.tags = (BACKEND_TAG, mechanism_name)
        self._tagged_run_id: str | None = None

    def log(self, step: int, histograms: Mapping[str, Histogram]) -> None:
        import wandb

        run = wandb.run
        if run is None or not histograms:
            return
        if self._tagged_run_id != run.id:
            run.tags = tuple(dict.fromkeys([*(run.tags or ()), *self.tags]))
            self._tagged_run_id = run.id
        # W&B's np_histogram takes (counts, edges), like numpy.histogram returns them.
        wandb.log({name: wandb.Histogram(np_histogram=(hist.counts.tolist(), hist.edges.tolist()))
                   for name, hist in histograms.items()}, step=step)
