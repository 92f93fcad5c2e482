from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import math
import os
import platform

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from dataflex_rl import keys
from dataflex_rl.tracking import RunIdentity, RunStore, run_store
from dataflex_rl.tracking.run_store import load_histograms, read_metrics, read_jsonl

from tests.tracking.identities import make_identity as shared_identity

NAN, INF = float("nan"), float("inf")


def make_identity() -> RunIdentity:
    return shared_identity(git_commit="f" * 40)


def temp_files(folder) -> list[str]:
    return sorted(path.name for path in folder.rglob("*") if path.name.endswith(".tmp"))


def same_float(left: float, right: float) -> bool:
    return (math.isnan(left) and math.isnan(right)) or left == right


class TestMetrics:
    STEPS = {
        0: {keys.SCORE_MEAN: 0.1, keys.GRAD_NORM: NAN, "val/accuracy": 0.5},
        1: {keys.SCORE_MEAN: 1 / 3, keys.GRAD_NORM: INF},
        2: {keys.SCORE_MEAN: -INF, keys.GRAD_NORM: 2.0, "val/accuracy": 0.75},
    }

    def log_all(self, store: RunStore) -> None:
        for step, metrics in self.STEPS.items():
            store.log_metrics(step, metrics)

    def test_jsonl_lines_round_trip_non_finite_values(self, tmp_path):
        store = RunStore(tmp_path)
        self.log_all(store)
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 3
        assert '"actor/grad_norm":NaN' in lines[0] and '"actor/grad_norm":Infinity' in lines[1]
        for record, (step, metrics) in zip(read_jsonl(tmp_path / "metrics.jsonl"), self.STEPS.items(), strict=True):
            assert record["step"] == step
            assert set(record) == {"step", *metrics}
            assert all(same_float(record[key], value) for key, value in metrics.items())

    def test_parquet_is_wide_sorted_and_exact(self, tmp_path):
        store = RunStore(tmp_path)
        self.log_all(store)
        store.close()
        table = pq.read_table(tmp_path / "metrics.parquet")
        assert table.column_names == ["step", keys.GRAD_NORM, keys.SCORE_MEAN, "val/accuracy"]
        assert table.schema.field("step").type == pa.int64()
        assert all(table.schema.field(name).type == pa.float64() for name in table.column_names[1:])
        assert table.column("step").to_pylist() == [0, 1, 2]
        scores = table.column(keys.SCORE_MEAN).to_pylist()
        assert scores == [0.1, 1 / 3, -INF]
        grad_norms = table.column(keys.GRAD_NORM).to_pylist()
        assert math.isnan(grad_norms[0]) and grad_norms[1:] == [INF, 2.0]
        # A key missing at a step is null, not NaN: the two stay distinguishable in parquet.
        accuracy = table.column("val/accuracy")
        assert accuracy.is_null().to_pylist() == [False, True, False]
        assert accuracy.to_pylist()[0::2] == [0.5, 0.75]

    def test_load_metrics_gives_the_same_frame_from_jsonl_and_parquet(self, tmp_path):
        store = RunStore(tmp_path)
        self.log_all(store)
        from_jsonl = read_metrics(tmp_path)
        store.close()
        assert (tmp_path / "metrics.parquet").exists()
        from_parquet = read_metrics(tmp_path)
        pd.testing.assert_frame_equal(from_jsonl, from_parquet)
        assert from_parquet["step"].dtype == np.int64
        assert np.isnan(from_parquet.loc[0, keys.GRAD_NORM]) and np.isnan(from_parquet.loc[1, "val/accuracy"])
        assert from_parquet.loc[2, keys.SCORE_MEAN] == -np.inf

    def test_rows_sorted_and_duplicate_step_merged_with_a_warning(self, tmp_path, caplog):
        store = RunStore(tmp_path)
        store.log_metrics(5, {"a": 1.0, "b": 2.0})
        with caplog.at_level(logging.WARNING):
            store.log_metrics(3, {"a": 3.0})
            store.log_metrics(5, {"a": 4.0})
            store.close()
        frame = read_metrics(tmp_path)
        assert frame["step"].tolist() == [3, 5]
        assert frame["a"].tolist() == [3.0, 4.0]  # last value of step 5 wins
        assert frame.loc[1, "b"] == 2.0  # keys of the earlier line are kept
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert sum("each step should be logged once" in message for message in warnings) == 1
        assert any("1 steps appear more than once (5)" in message for message in warnings)

    def test_values_become_floats(self, tmp_path):
        store = RunStore(tmp_path)
        store.log_metrics(0, {"int": 3, "numpy": np.float32(0.5), "tensor": torch.tensor(0.25), "bool": True})
        assert read_jsonl(tmp_path / "metrics.jsonl") == [
            {"step": 0, "int": 3.0, "numpy": 0.5, "tensor": 0.25, "bool": 1.0}
        ]

    @pytest.mark.parametrize(
        ("step", "metrics", "message"),
        [
            (-1, {"a": 1.0}, "step = -1"),
            (1.0, {"a": 1.0}, "step = 1.0"),
            (0, {"a": "high"}, "metric 'a' at step 0 = 'high' is not a number"),
            (0, {"step": 1.0}, "metric key 'step'"),
        ],
    )
    def test_bad_input_is_refused(self, tmp_path, step, metrics, message):
        with pytest.raises(ValueError, match=message):
            RunStore(tmp_path).log_metrics(step, metrics)
        assert read_jsonl(tmp_path / "metrics.jsonl") == []

    def test_empty_run_compacts_to_a_step_only_table(self, tmp_path):
        store = RunStore(tmp_path)
        store.close()
        assert pq.read_table(tmp_path / "metrics.parquet").column_names == ["step"]
        assert read_metrics(tmp_path).empty
        assert len(load_histograms(tmp_path)) == 0

    def test_logging_after_close_raises(self, tmp_path):
        store = RunStore(tmp_path)
        store.close()
        with pytest.raises(RuntimeError, match="closed"):
            store.log_metrics(0, {"a": 1.0})


class TestHistograms:
    def test_round_trip_through_jsonl_and_parquet(self, tmp_path):
        store = RunStore(tmp_path)
        store.log_histogram(10, keys.HIST_WEIGHT, [-INF, 0.5, 1.0, 1.5], [0, 7, 3])
        store.log_histogram(0, keys.HIST_TOKEN_PROB, np.array([0.0, 0.5, 1.0]), np.array([4, 6]))
        # torch.histc returns float counts: integral floats are accepted.
        store.log_histogram(
            0, keys.HIST_WEIGHT, torch.tensor([0.0, 1.0]), torch.histc(torch.tensor([0.2, 0.7]), 1, 0, 1)
        )
        from_jsonl = load_histograms(tmp_path)
        store.close()
        table = pq.read_table(tmp_path / "histograms.parquet")
        assert table.schema == run_store.HISTOGRAM_SCHEMA
        assert table.to_pylist() == [
            {"step": 0, "name": keys.HIST_TOKEN_PROB, "edges": [0.0, 0.5, 1.0], "counts": [4, 6]},
            {"step": 0, "name": keys.HIST_WEIGHT, "edges": [0.0, 1.0], "counts": [2]},
            {"step": 10, "name": keys.HIST_WEIGHT, "edges": [-INF, 0.5, 1.0, 1.5], "counts": [0, 7, 3]},
        ]
        from_parquet = load_histograms(tmp_path)
        assert from_jsonl["step"].tolist() == from_parquet["step"].tolist() == [0, 0, 10]
        assert [list(edges) for edges in from_parquet["edges"]] == [[0.0, 0.5, 1.0], [0.0, 1.0], [-INF, 0.5, 1.0, 1.5]]

    @pytest.mark.parametrize(
        ("edges", "counts", "message"),
        [
            ([0.0, 1.0], [1, 2], "2 edges and 2 counts"),
            ([0.0], [], "1 edges and 0 counts"),
            ([0.0, 1.0, 1.0], [1, 2], "strictly increasing"),
            ([0.0, 1.0], [-1], "count -1 is not an integer >= 0"),
            ([0.0, 1.0], [2.5], "count 2.5 is not an integer >= 0"),
        ],
    )
    def test_bad_histograms_are_refused(self, tmp_path, edges, counts, message):
        with pytest.raises(ValueError, match=message):
            RunStore(tmp_path).log_histogram(0, "h", edges, counts)


class TestResume:
    def write_run(self, folder, steps: range) -> None:
        store = RunStore(folder)
        for step in steps:
            store.log_metrics(step, {"loss": float(step)})
            store.log_histogram(step, "h", [0.0, 1.0], [step])
        store.detach()  # a process killed here leaves the jsonl files without parquet

    def test_truncate_after_drops_later_steps_and_a_partial_line(self, tmp_path):
        self.write_run(tmp_path, range(6))
        with open(tmp_path / "metrics.jsonl", "ab") as handle:
            handle.write(b'{"step":6,"loss":6.')  # cut mid-line by a hard kill
        store = RunStore(tmp_path)
        assert store.truncate_after(3) == 4  # steps 4 and 5, in both files
        assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
        assert [r["step"] for r in read_jsonl(tmp_path / "histograms.jsonl")] == [0, 1, 2, 3]
        assert (tmp_path / "metrics.jsonl").read_bytes().endswith(b"}\n")
        assert store.last_logged_step() == 3
        store.log_metrics(4, {"loss": 40.0})
        store.close()
        assert read_metrics(tmp_path)["loss"].tolist() == [0.0, 1.0, 2.0, 3.0, 40.0]
        assert temp_files(tmp_path) == []

    def test_truncate_after_the_last_step_only_repairs(self, tmp_path):
        self.write_run(tmp_path, range(3))
        before = (tmp_path / "histograms.jsonl").read_bytes()
        assert RunStore(tmp_path).truncate_after(10) == 0
        assert (tmp_path / "histograms.jsonl").read_bytes() == before

    def test_append_after_a_hard_kill_cuts_the_partial_line(self, tmp_path, caplog):
        self.write_run(tmp_path, range(2))
        with open(tmp_path / "metrics.jsonl", "ab") as handle:
            handle.write(b'{"step":2,"lo')
        store = RunStore(tmp_path)
        with caplog.at_level(logging.WARNING):
            store.log_metrics(2, {"loss": 2.0})
        assert "dropped a partial last line" in caplog.text
        assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2]

    def test_append_keeps_a_complete_line_that_lost_only_its_newline(self, tmp_path):
        (tmp_path / "metrics.jsonl").write_bytes(b'{"step":0,"loss":0.5}')
        RunStore(tmp_path).log_metrics(1, {"loss": 1.5})
        assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 0, "loss": 0.5}, {"step": 1, "loss": 1.5}]

    def test_a_corrupt_line_before_the_end_is_an_error(self, tmp_path):
        (tmp_path / "metrics.jsonl").write_bytes(b'{"step":0,"loss":0.5}\nnot json\n{"step":2,"loss":1}\n')
        with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is not a run-store record"):
            RunStore(tmp_path).truncate_after(1)

    def test_last_logged_step(self, tmp_path):
        store = RunStore(tmp_path)
        assert store.last_logged_step() is None
        store.log_metrics(7, {"a": 1.0})
        store.log_metrics(8, {"a": 1.0})
        assert store.last_logged_step() == 8

    def test_stale_parquet_is_removed_when_a_closed_run_grows(self, tmp_path):
        store = RunStore(tmp_path)
        store.log_metrics(0, {"a": 1.0})
        store.close("failed")
        assert (tmp_path / "metrics.parquet").exists()
        resumed = RunStore(tmp_path)
        resumed.log_metrics(1, {"a": 2.0})
        assert not (tmp_path / "metrics.parquet").exists()
        assert read_metrics(tmp_path)["step"].tolist() == [0, 1]


class TestConfigMetaStatus:
    def test_config_yaml_round_trip_keeps_order(self, tmp_path):
        config = OmegaConf.create({"trainer": {"steps": 5, "lr": 1e-5}, "name": "${trainer.steps}", "tags": ["a"]})
        store = RunStore(tmp_path)
        store.log_config(config)
        config = run_store.read_config(store.run_dir)
        assert config == {"trainer": {"steps": 5, "lr": 1e-5}, "name": 5, "tags": ["a"]}
        assert list(config) == ["trainer", "name", "tags"]

    def test_meta_identity_versions_and_times(self, tmp_path):
        store = RunStore(tmp_path)
        meta = store.write_meta(make_identity(), extra={"command": "python -m dataflex_rl"})
        on_disk = json.loads((tmp_path / "meta.json").read_text())
        assert on_disk == meta
        assert {k: on_disk[k] for k in ("sweep", "run", "alpha", "seed", "git_commit")} == {
            "sweep": "sweep1",
            "run": "a0.5-s1",
            "alpha": 0.5,
            "seed": 1,
            "git_commit": "f" * 40,
        }
        assert on_disk["versions"]["python"] == platform.python_version()
        assert on_disk["versions"]["torch"] == importlib.metadata.version("torch")
        assert on_disk["command"] == "python -m dataflex_rl"
        assert on_disk["end_time"] is None and on_disk["wall_time_s"] is None
        store.close()
        closed = run_store.read_meta(store.run_dir)
        start = datetime.datetime.fromisoformat(closed["start_time"])
        end = datetime.datetime.fromisoformat(closed["end_time"])
        assert start.utcoffset() == datetime.timedelta(0)
        assert closed["wall_time_s"] == (end - start).total_seconds() >= 0

    def test_resumed_meta_keeps_the_first_start_time(self, tmp_path):
        first = RunStore(tmp_path).write_meta(make_identity())
        second = RunStore(tmp_path).write_meta(make_identity())
        assert second["start_time"] == first["start_time"]
        assert len(second["resume_times"]) == 1 and "resume_times" not in first

    def test_meta_extra_cannot_override_identity(self, tmp_path):
        with pytest.raises(ValueError, match=r"\['seed'\] are reserved"):
            RunStore(tmp_path).write_meta(make_identity(), extra={"seed": 2})

    def test_status_transitions(self, tmp_path):
        store = RunStore(tmp_path)
        assert run_store.read_status(store.run_dir) is None
        assert store.set_status("pending")["step"] == 0
        store.set_status("running", step=0)
        for step in range(3):
            store.log_metrics(step, {"a": 1.0})
        store.record_error("failed", error="RuntimeError: boom", traceback="Traceback ...\nRuntimeError: boom\n")
        store.close("failed")
        status = run_store.read_status(store.run_dir)
        assert (status["state"], status["step"], status["error"]) == ("failed", 2, "RuntimeError: boom")
        assert status["traceback"].endswith("RuntimeError: boom\n")
        # Resume: the error belongs to the failed attempt and is cleared.
        resumed = RunStore(tmp_path)
        resumed.truncate_after(1)
        resumed.set_status("running", step=1)
        assert run_store.read_status(resumed.run_dir)["error"] is None
        resumed.log_metrics(2, {"a": 2.0})
        resumed.log_metrics(3, {"a": 3.0})
        resumed.close("completed")
        status = run_store.read_status(resumed.run_dir)
        assert (status["state"], status["step"], status["error"], status["traceback"]) == ("completed", 3, None, None)
        assert datetime.datetime.fromisoformat(status["updated"]).utcoffset() == datetime.timedelta(0)

    def test_bad_states_are_refused(self, tmp_path):
        store = RunStore(tmp_path)
        with pytest.raises(ValueError, match="'done' is not allowed; allowed states: pending, running, completed"):
            store.set_status("done")
        with pytest.raises(ValueError, match="close state 'pending' is not allowed"):
            store.close("pending")

    def test_atomic_writes_leave_no_temp_files(self, tmp_path):
        store = RunStore(tmp_path)
        store.write_config({"a": 1})
        store.write_meta(make_identity())
        store.set_status("running")
        store.log_metrics(0, {"a": 1.0})
        store.log_histogram(0, "h", [0.0, 1.0], [1])
        store.truncate_after(0)
        store.close()
        assert temp_files(tmp_path) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "config.yaml",
            "histograms.jsonl",
            "histograms.parquet",
            "meta.json",
            "metrics.jsonl",
            "metrics.parquet",
            "status.json",
        ]

    def test_a_failed_atomic_write_keeps_the_old_file_and_no_temp_file(self, tmp_path, monkeypatch):
        store = RunStore(tmp_path)
        store.set_status("running", step=4)

        def failing_replace(source, destination):
            raise OSError("disk full")

        monkeypatch.setattr(os, "replace", failing_replace)
        with pytest.raises(OSError, match="disk full"):
            store.set_status("completed", step=9)
        with pytest.raises(OSError, match="disk full"):
            store.write_config({"a": 1})
        monkeypatch.undo()
        status = run_store.read_status(store.run_dir)
        assert status["state"] == "running" and status["step"] == 4
        assert not (tmp_path / "config.yaml").exists()
        assert temp_files(tmp_path) == []


class TestVerifyRun:
    """``run_store.verify_run``: the one check of a run's record that the sweep driver and the analysis call."""

    CONFIG = {"seed": 1, "axes": ["dataflex.actuator.params.alpha", "trainer.lr", "seed"],
              "dataflex": {"actuator": {"params": {"alpha": 0.5}}}, "trainer": {"lr": 1e-4, "total_steps": 3}}

    def written(self, run_dir):
        """A completed run as the local trainer records it: identity computed from its config."""
        store = RunStore(run_dir)
        store.write_config(self.CONFIG)
        store.write_meta(RunIdentity.for_config(self.CONFIG, sweep="s", run=run_dir.name, backend="local",
                                                mechanism="reweight", alpha=0.5, seed=1,
                                                axis_keys=self.CONFIG["axes"]))
        store.close("completed")
        return run_dir

    def test_a_run_as_written_passes(self, tmp_path):
        run_dir = self.written(tmp_path / "r")
        assert run_store.verify_run(run_dir) == []
        assert run_store.config_identity(self.CONFIG) == {
            "config_hash": run_store.read_meta(run_dir)["config_hash"], "alpha": 0.5, "seed": 1,
            "axes": {"alpha": 0.5, "trainer.lr": 1e-4, "seed": 1}}

    def test_each_way_a_record_fails_is_named(self, tmp_path):
        """rm / ln -s / edit config.yaml or meta.json of a completed run folder, then read it"""
        verify = run_store.verify_run
        assert verify(tmp_path / "absent") == ["no run folder"]
        run_dir = self.written(tmp_path / "r")
        link = tmp_path / "link"
        link.symlink_to(run_dir, target_is_directory=True)
        assert verify(link) == [f"the run folder is a symbolic link (to {run_dir}), not the run's own folder"]
        (tmp_path / "file").write_text("")
        assert verify(tmp_path / "file") == ["the run folder is not a folder"]

        config_text = (run_dir / "config.yaml").read_text()
        (run_dir / "config.yaml").write_text(config_text.replace("0.0001", "0.5"))
        reasons = verify(run_dir)
        assert len(reasons) == 3 and reasons[0].startswith("config.yaml is not the config the run recorded")
        assert reasons[1].startswith("meta.json's config_hash ")
        assert reasons[2] == "meta.json's axes differ from config.yaml's (trainer.lr 0.0001 vs 0.5)"
        (run_dir / "config.yaml").write_text(config_text)

        meta_text = (run_dir / "meta.json").read_text()
        meta = json.loads(meta_text)
        (run_dir / "meta.json").write_text(json.dumps({**meta, "alpha": 0.9, "seed": 2,
                                                       "axes": {**meta["axes"], "alpha": 0.9}}))
        assert verify(run_dir) == ["meta.json says alpha 0.9, config.yaml says 0.5",
                                   "meta.json says seed 2, config.yaml says 1",
                                   "meta.json's axes differ from config.yaml's (alpha 0.9 vs 0.5)"]
        (run_dir / "meta.json").write_text(meta_text)
        assert verify(run_dir) == []

        (run_dir / "status.json").unlink()
        assert verify(run_dir) == ["no status.json"]

    def test_a_verl_run_reads_its_seed_and_axes_from_its_run_block(self):
        config = {"data": {"seed": 7}, "dataflex": {"actuator": {"params": {"alpha": 0.25}}},
                  "dataflex_run": {"seed": 3, "axes": ["dataflex.actuator.params.alpha", "seed"]}, "seed": 99}
        identity = run_store.config_identity(config)
        assert (identity["alpha"], identity["seed"], identity["axes"]) == (0.25, 3, {"alpha": 0.25, "seed": 3})
        del config["dataflex_run"]["seed"]
        assert run_store.config_identity(config)["seed"] == 7  # verl's own seed when the block has none
