"""A real local run with an extra logger registered from a test module and composed from a YAML outside conf/."""

from __future__ import annotations

from dataflex_rl import keys
from dataflex_rl.tracking import LOGGERS
from dataflex_rl.tracking.run_store import read_metrics
from dataflex_rl.local.train import run
from tests import registry_snapshot
from tests.tracking.test_tracking_logger_registry import ThrowawayLogger

from .conftest import compose_train, tiny_overrides


def test_a_run_feeds_a_registered_logger_the_run_stores_numbers(tmp_path, sft_cache):
    extra_conf = tmp_path / "extra_conf"
    (extra_conf / "logger" / "throwaway").mkdir(parents=True)
    (extra_conf / "logger" / "throwaway" / "default.yaml").write_text("every: 1\nprefix: ''\n")
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(run_dir, sft_cache) + [f"hydra.searchpath=[file://{extra_conf}]",
                                                       "+logger/throwaway=default"]
    with registry_snapshot(LOGGERS):
        LOGGERS.register("throwaway")(ThrowawayLogger)
        ThrowawayLogger.built.clear()
        assert run(compose_train(overrides)) == 0
    (logger,) = ThrowawayLogger.built
    assert logger.closed == "completed" and logger.run_dir == run_dir
    frame = read_metrics(run_dir)
    assert [step for step, _ in logger.metrics] == frame["step"].tolist() == [0, 1, 2, 3]
    received = {step: metrics[keys.SCORE_MEAN] for step, metrics in logger.metrics if keys.SCORE_MEAN in metrics}
    assert received and received == frame.set_index("step")[keys.SCORE_MEAN].dropna().to_dict()
