"""A run record you can trust: the reader API, the config fingerprint, the run lock, file modes and failures that
are always recorded (issue 11)."""

from __future__ import annotations

import errno
import math
import multiprocessing
import os
import stat

import pytest

from dataflex_rl.tracking import MultiLogger, RunStore
from dataflex_rl.tracking import run_store as rs
from dataflex_rl.tracking.run_store import files as run_store_files

from tests.tracking.identities import make_identity

CONFIG = {
    "seed": 1,
    "run_dir": "runs/x",
    "threads": 1,
    "logger": {"wandb": {"mode": "offline"}, "hist_every": 10},
    "dataflex": {"actuator": {"name": "advantage_reweight", "params": {"alpha": 0.5}}},
    "trainer": {"lr": 0.5, "total_steps": 6},
}


def with_changes(**dotted):
    """A deep copy of CONFIG with ``a__b=value`` applied."""
    import copy

    config = copy.deepcopy(CONFIG)
    for key, value in dotted.items():
        *parents, last = key.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[last] = value
    return config


def started_store(tmp_path, config=CONFIG) -> RunStore:
    store = RunStore(tmp_path)
    store.write_config(config)
    store.write_meta(make_identity())
    return store


# --- reader API ---------------------------------------------------------------------------------------------
class TestReaders:
    def test_readers_give_status_meta_config_curve_and_final_value(self, tmp_path):
        store = started_store(tmp_path)
        store.set_status("running", step=0)
        for step, accuracy in ((0, 0.25), (1, math.nan), (2, 0.75)):
            store.log_metrics(step, {"val/accuracy": accuracy, "loss": 1.0 / (step + 1)})
        store.log_histogram(2, "w", [0.0, 1.0], [3])
        # While the run is going (jsonl only) and after close (parquet) the readers give the same answers.
        for closed in (False, True):
            if closed:
                store.close()
            assert rs.read_status(tmp_path)["state"] == ("completed" if closed else "running")
            assert rs.read_meta(tmp_path)["config_fingerprint"] == rs.config_fingerprint(CONFIG)
            assert rs.read_config(tmp_path) == CONFIG
            curve = rs.read_curve(tmp_path, "val/accuracy")
            assert curve.index.tolist() == [0, 2] and curve.tolist() == [0.25, 0.75]
            assert rs.final_value(tmp_path, "val/accuracy") == 0.75
            assert rs.final_value(tmp_path, "never/logged") is None
            assert rs.read_metrics(tmp_path, ["loss"]).columns.tolist() == ["step", "loss"]
            assert rs.load_histograms(tmp_path)["name"].tolist() == ["w"]
            assert rs.metrics_source(tmp_path) == ("parquet" if closed else "jsonl")
        assert rs.is_run_store(tmp_path) and not rs.is_run_store(tmp_path / "missing")
        assert rs.STATES == ("pending", "running", "completed", "failed", "interrupted")

    def test_a_damaged_file_is_named(self, tmp_path):
        started_store(tmp_path)
        (tmp_path / "status.json").write_text('{"state": "runn')
        with pytest.raises(rs.RunStoreError, match=r"status\.json is not valid JSON"):
            rs.read_status(tmp_path)

    def test_a_fresh_folder_reads_as_empty(self, tmp_path):
        assert rs.read_status(tmp_path) is None and rs.read_meta(tmp_path) is None
        assert rs.read_config(tmp_path) is None and rs.final_value(tmp_path, "x") is None


# --- fingerprint ----------------------------------------------------------------------------------------------
class TestFingerprint:
    def test_resume_with_a_different_alpha_and_lr_is_refused_naming_both(self, tmp_path):
        started_store(tmp_path)
        changed = with_changes(dataflex__actuator__params__alpha=0.0, trainer__lr=0.01)
        with pytest.raises(rs.ConfigMismatchError) as refused:
            rs.check_resume(tmp_path, changed)
        message = str(refused.value)
        assert "dataflex.actuator.params.alpha: recorded 0.5, now 0.0" in message
        assert "trainer.lr: recorded 0.5, now 0.01" in message

    def test_logging_threads_and_growing_total_steps_may_differ(self, tmp_path):
        started_store(tmp_path)
        allowed = with_changes(logger__wandb__mode="disabled", threads=4, run_dir="/elsewhere", trainer__total_steps=9)
        rs.check_resume(tmp_path, allowed)  # no error
        assert rs.config_fingerprint(allowed) == rs.config_fingerprint(CONFIG)
        assert rs.config_fingerprint(with_changes(trainer__lr=0.4)) != rs.config_fingerprint(CONFIG)

    def test_total_steps_may_not_shrink_and_a_new_key_counts(self, tmp_path):
        started_store(tmp_path)
        with pytest.raises(rs.ConfigMismatchError, match=r"trainer\.total_steps: recorded 6, now 3"):
            rs.check_resume(tmp_path, with_changes(trainer__total_steps=3))
        with pytest.raises(rs.ConfigMismatchError, match=r"trainer\.clip: recorded '<absent>', now 0\.2"):
            rs.check_resume(tmp_path, with_changes(trainer__clip=0.2))


# --- lock ---------------------------------------------------------------------------------------------------
def _try_lock(run_dir, queue) -> None:
    try:
        rs.RunLock(run_dir).acquire()
        queue.put("acquired")
    except rs.RunLockedError as error:
        queue.put(str(error))


class TestLock:
    def test_a_second_process_is_refused_with_the_holders_pid(self, tmp_path):
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        with RunStore(tmp_path).lock():
            process = context.Process(target=_try_lock, args=(tmp_path, queue))
            process.start()
            process.join(120)
            answer = queue.get(timeout=60)
        assert f"pid {os.getpid()}" in answer and "another process" in answer
        # Released: the next writer gets it.
        process = context.Process(target=_try_lock, args=(tmp_path, queue))
        process.start()
        process.join(120)
        assert queue.get(timeout=60) == "acquired"

    def test_stale_temporaries_are_removed(self, tmp_path):
        (tmp_path / "checkpoints").mkdir()
        leftovers = [tmp_path / ".status.json.abc123.tmp", tmp_path / "checkpoints" / ".last.pt.x1.tmp"]
        for path in leftovers:
            path.write_bytes(b"x")
        (tmp_path / "checkpoints" / "last.pt").write_bytes(b"keep")
        assert sorted(rs.remove_stale_temporaries(tmp_path)) == sorted(p.name for p in leftovers)
        assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["last.pt"]


# --- file modes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_follow_the_umask(tmp_path, umask, expected):
    previous = os.umask(umask)
    try:
        store = started_store(tmp_path)
        store.set_status("running", step=0)
        store.log_metrics(0, {"x": 1.0})
        store.close()
        with rs.atomic_path(tmp_path / "checkpoint.pt") as temporary, open(temporary, "wb") as handle:
            handle.write(b"weights")
    finally:
        os.umask(previous)
    for name in ("config.yaml", "meta.json", "status.json", "metrics.parquet", "histograms.parquet", "checkpoint.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name


# --- failures are recorded ----------------------------------------------------------------------------------
def _fail_inside(store: RunStore, error: Exception) -> None:
    with pytest.raises(type(error)), MultiLogger([store], critical=[store]) as loggers:
        loggers.log_metrics(3, {"x": 1.0})
        raise error


class TestFailures:
    def test_a_corrupt_metrics_file_is_recorded_as_failed(self, tmp_path):
        store = started_store(tmp_path)
        store.set_status("running", step=2)
        store.log_metrics(1, {"x": 0.0})
        store.log_metrics(2, {"x": 0.5})
        with open(tmp_path / "metrics.jsonl", "ab") as handle:  # someone wrote garbage into the store
            handle.write(b"garbage\n")
        with pytest.raises(rs.RunStoreError), MultiLogger([store], critical=[store]) as loggers:
            loggers.log_metrics(3, {"x": 1.0})
            store.compact()  # reading the store fails: the run's own failure
        status = rs.read_status(tmp_path)
        assert status["state"] == "failed" and status["step"] == 3
        assert "line 3 is not a run-store record" in status["error"] and "Traceback" in status["traceback"]

    def test_a_full_disk_is_recorded_with_the_space_of_the_reserve(self, tmp_path, monkeypatch):
        store = started_store(tmp_path)
        store.set_status("running", step=0)
        assert (tmp_path / rs.RESERVE_FILE).stat().st_size == rs.RESERVE_BYTES
        real = rs.atomic_write_bytes

        def full_disk_until_the_reserve_is_given_back(path, data):
            # A disk with no free block: writes succeed only once the reserve file's blocks are released.
            if (tmp_path / rs.RESERVE_FILE).exists():
                raise OSError(errno.ENOSPC, "No space left on device")
            real(path, data)

        monkeypatch.setattr(run_store_files, "atomic_write_bytes", full_disk_until_the_reserve_is_given_back)
        _fail_inside(store, OSError(errno.ENOSPC, "No space left on device"))
        status = rs.read_status(tmp_path)
        assert status["state"] == "failed" and "No space left" in status["error"]
        assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    def test_with_no_space_at_all_the_old_status_is_overwritten_in_place(self, tmp_path, monkeypatch):
        store = started_store(tmp_path)
        store.set_status("running", step=0)
        store._reserve.release()

        def no_space(path, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(run_store_files, "atomic_write_bytes", no_space)
        _fail_inside(store, RuntimeError("boom " * 2000))
        status = rs.read_status(tmp_path)
        assert status["state"] == "failed" and status["error"].endswith("boom ") and "(cut)" in status["traceback"]

    def test_a_failed_atomic_write_on_a_full_disk_leaves_no_temp_file(self, tmp_path, monkeypatch):
        def full(descriptor, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space"):
            rs.atomic_write_json(tmp_path / "status.json", {"state": "running"})
        assert list(tmp_path.iterdir()) == []
