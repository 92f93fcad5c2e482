"""A compact progress line through :mod:`logging` every ``every`` steps and at evaluation steps, e.g.
``step 120 | critic/score/mean=0.4531 val/accuracy=0.39 actor/grad_norm=1.274 dataflex/weight/std=0.1182``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from dataflex_rl import keys
from dataflex_rl.tracking.run_store import COMPLETED
from dataflex_rl.validation import check_int_at_least

LOG = logging.getLogger(__name__)

DEFAULT_KEYS = (keys.SCORE_MEAN, keys.VAL_ACCURACY, keys.GRAD_NORM, f"{keys.WEIGHT_PREFIX}/std")


class ConsoleLogger:
    """``step N | key=value ...`` every ``every`` steps and at any step with ``val/accuracy``."""

    name = "console"

    def __init__(self, every: int = 10, metric_keys: Sequence[str] = DEFAULT_KEYS, log: logging.Logger = LOG) -> None:
        self.every = check_int_at_least("console every", every, 1)
        self.metric_keys = tuple(metric_keys)
        self.log = log
        self._last_step: int | None = None

    def log_config(self, config: dict) -> None:
        """Nothing: the config is in ``config.yaml`` and W&B."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._last_step = step
        if step % self.every != 0 and keys.VAL_ACCURACY not in metrics:
            return
        shown = " ".join(f"{key}={float(metrics[key]):.4g}" for key in self.metric_keys if key in metrics)
        self.log.info("step %d | %s", step, shown or "(no selected metrics)")

    def log_histogram(self, step: int, name: str, edges: Sequence[float], counts: Sequence[int]) -> None:
        """Nothing: histograms do not fit a console line."""

    def close(self, state: str = COMPLETED) -> None:
        """A last line: the final state and the last step logged."""
        if self._last_step is not None:
            self.log.info("run %s after step %d", state, self._last_step)
        elif state == COMPLETED:
            self.log.info("run completed: it resumed at its last step, nothing was left to train")
        else:
            self.log.info("run %s before it logged a step", state)
