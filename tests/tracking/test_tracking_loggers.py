"""MultiLogger fan-out and isolation, the console line, and the logger protocol."""

from __future__ import annotations

import logging

import pytest

from dataflex_rl import keys
from dataflex_rl.tracking import ConsoleLogger, Logger, MultiLogger, RunStore, WandbLogger, run_store


class RecordingLogger:
    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log_config(self, config):
        self.calls.append(("log_config", config))

    def log_metrics(self, step, metrics):
        self.calls.append(("log_metrics", step, dict(metrics)))

    def log_histogram(self, step, name, edges, counts):
        self.calls.append(("log_histogram", step, name))

    def close(self, state="completed"):
        self.calls.append(("close", state))


class ExplodingLogger(RecordingLogger):
    """Raises on its second call (like W&B losing its connection mid-run)."""

    name = "exploding"

    def log_metrics(self, step, metrics):
        super().log_metrics(step, metrics)
        if len(self.calls) >= 2:
            raise ConnectionError("server went away")


class TestMultiLogger:
    def test_a_failing_logger_is_reported_once_and_skipped(self, caplog):
        exploding, recording = ExplodingLogger(), RecordingLogger()
        loggers = MultiLogger([exploding, recording])
        with caplog.at_level(logging.WARNING):
            loggers.log_config({"a": 1})
            for step in range(4):
                loggers.log_metrics(step, {"x": float(step)})
            loggers.close()
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "exploding" in warnings[0] and "ConnectionError: server went away" in warnings[0]
        # The failing logger saw calls up to its failure and none after; the other one saw everything.
        assert exploding.calls == [("log_config", {"a": 1}), ("log_metrics", 0, {"x": 0.0})]
        assert recording.calls == [
            ("log_config", {"a": 1}),
            *[("log_metrics", step, {"x": float(step)}) for step in range(4)],
            ("close", "completed"),
        ]
        assert loggers.active == [recording]

    def test_a_critical_logger_error_propagates(self):
        exploding = ExplodingLogger()
        loggers = MultiLogger([exploding], critical=[exploding])
        loggers.log_metrics(0, {})
        with pytest.raises(ConnectionError):
            loggers.log_metrics(1, {})

    def test_critical_must_be_one_of_the_loggers(self):
        with pytest.raises(ValueError, match="critical loggers must be among the loggers"):
            MultiLogger([RecordingLogger()], critical=[RecordingLogger()])

    @pytest.mark.parametrize(("hist_every", "forwarded"), [(1, [0, 1, 2, 3, 4, 5, 6]), (3, [0, 3, 6]), (0, [])])
    def test_histograms_every_n_steps(self, hist_every, forwarded):
        recording = RecordingLogger()
        loggers = MultiLogger([recording], hist_every=hist_every)
        for step in range(7):
            loggers.log_histogram(step, "h", [0.0, 1.0], [1])
        assert [call[1] for call in recording.calls] == forwarded
        assert [step for step in range(7) if loggers.wants_histogram(step)] == forwarded

    def test_bad_hist_every_and_state(self):
        with pytest.raises(ValueError, match="hist_every = -1"):
            MultiLogger([], hist_every=-1)
        with pytest.raises(ValueError, match="close state 'done' is not allowed; allowed states: completed, failed"):
            MultiLogger([]).close("done")

    def test_close_happens_once(self):
        recording = RecordingLogger()
        loggers = MultiLogger([recording])
        loggers.close("completed")
        loggers.close("failed")
        assert recording.calls == [("close", "completed")]

    def test_context_manager_records_the_failure(self, tmp_path):
        store, recording = RunStore(tmp_path), RecordingLogger()
        with (
            pytest.raises(RuntimeError, match="diverged"),
            MultiLogger([store, recording], critical=[store]) as loggers,
        ):
            loggers.log_metrics(0, {"a": 1.0})
            raise RuntimeError("loss diverged")
        status = run_store.read_status(store.run_dir)
        assert (status["state"], status["step"]) == ("failed", 0)
        assert status["error"] == "RuntimeError: loss diverged"
        assert 'raise RuntimeError("loss diverged")' in status["traceback"]
        assert recording.calls[-1] == ("close", "failed")
        assert (tmp_path / "metrics.parquet").exists()

    def test_context_manager_interrupted_and_completed(self, tmp_path):
        interrupted = RunStore(tmp_path / "interrupted")
        with pytest.raises(KeyboardInterrupt), MultiLogger([interrupted]):
            raise KeyboardInterrupt
        assert run_store.read_status(interrupted.run_dir)["state"] == "interrupted"
        completed = RunStore(tmp_path / "completed")
        with MultiLogger([completed]):
            pass
        assert run_store.read_status(completed.run_dir) | {"updated": None} == {
            "state": "completed",
            "step": 0,
            "updated": None,
            "error": None,
            "traceback": None,
        }

    def test_implementations_follow_the_protocol(self, tmp_path):
        assert isinstance(RunStore(tmp_path), Logger)
        assert isinstance(ConsoleLogger(), Logger)
        assert isinstance(WandbLogger.__new__(WandbLogger), Logger)
        assert isinstance(MultiLogger([]), Logger)


class TestConsoleLogger:
    def test_lines_every_n_steps_and_at_evaluation_steps(self, caplog):
        console = ConsoleLogger(every=5)
        with caplog.at_level(logging.INFO, logger="dataflex_rl.tracking.console"):
            for step in range(11):
                metrics = {keys.SCORE_MEAN: step / 10, keys.GRAD_NORM: 1.23456, "actor/pg_loss": 9.0}
                if step == 7:
                    metrics[keys.VAL_ACCURACY] = 0.375
                console.log_metrics(step, metrics)
            console.close("completed")
        lines = [record.getMessage() for record in caplog.records]
        assert lines == [
            "step 0 | critic/score/mean=0 actor/grad_norm=1.235",
            "step 5 | critic/score/mean=0.5 actor/grad_norm=1.235",
            "step 7 | critic/score/mean=0.7 val/accuracy=0.375 actor/grad_norm=1.235",
            "step 10 | critic/score/mean=1 actor/grad_norm=1.235",
            "run completed after step 10",
        ]

    def test_non_finite_values_and_missing_keys(self, caplog):
        console = ConsoleLogger(every=1, metric_keys=("a", "b"))
        with caplog.at_level(logging.INFO, logger="dataflex_rl.tracking.console"):
            console.log_metrics(0, {"a": float("nan"), "b": float("-inf")})
            console.log_metrics(1, {"c": 1.0})
        assert [record.getMessage() for record in caplog.records] == [
            "step 0 | a=nan b=-inf",
            "step 1 | (no selected metrics)",
        ]

    def test_bad_every(self):
        with pytest.raises(ValueError, match="console every = 0"):
            ConsoleLogger(every=0)
