"""Caches keyed by what they hold (issue: the record under hostile use, family 3): the SFT warm-start cache's key
hashes a local checkpoint's content, an entry is whole only when its files match ``done.json``, a whole entry is read
without its lock, and a write that fails leaves nothing behind."""

from __future__ import annotations

import logging
from pathlib import Path

import filelock
import pytest

from dataflex_rl.tinylm import sft
from dataflex_rl.run_config import ModelConfig, SFTConfig, TaskConfig
from dataflex_rl.tasks import build_task

TASK = TaskConfig(name="arithmetic", params={})


def tiny(cache: Path, steps: int = 2) -> tuple[ModelConfig, SFTConfig]:
    return (ModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=32),
            SFTConfig(steps=steps, batch_size=4, cache_dir=str(cache), seed=1))


def build(model: ModelConfig, config: SFTConfig) -> Path:
    return sft.warm_start(model, TASK, config, build_task("arithmetic", {}))[2]


def test_a_checkpoint_replaced_in_model_path_is_a_new_key(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"first weights")
    model, config = ModelConfig(path=str(checkpoint)), SFTConfig()
    first = sft.sft_cache_key(model, TASK, config)
    (checkpoint / "model.safetensors").write_bytes(b"other weights")
    assert sft.sft_cache_key(model, TASK, config) != first
    (checkpoint / "model.safetensors").write_bytes(b"first weights")
    assert sft.sft_cache_key(model, TASK, config) == first  # the content, not the path or the time, is the key


def test_a_cut_checkpoint_behind_a_kept_done_json_is_built_again(tmp_path: Path, caplog) -> None:
    model, config = tiny(tmp_path / "cache")
    directory = build(model, config)
    assert sft.cached_entry(directory)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert not sft.cached_entry(directory)
    with caplog.at_level(logging.WARNING):
        assert build(model, config) == directory
    assert "is not whole" in caplog.text and sft.cached_entry(directory)


def test_a_whole_entry_is_read_without_its_lock_and_a_cache_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    model, config = tiny(tmp_path / "cache")
    directory = build(model, config)

    def read_only(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(filelock.UnixFileLock, "acquire", read_only)
    assert build(model, config) == directory  # a whole entry on a read-only mount still serves
    _, other = tiny(tmp_path / "empty", steps=3)
    with pytest.raises(sft.SFTCacheError, match=r"sft.cache_dir = '.*empty' cannot hold a new warm start "
                                                r"\(Read-only file system\): give a writable sft.cache_dir"):
        build(model, other)


def test_a_write_that_fails_names_the_cache_and_leaves_no_temporary_folder(tmp_path, monkeypatch) -> None:
    model, config = tiny(tmp_path / "cache")

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full_disk)
    with pytest.raises(sft.SFTCacheError, match=r"could not be written .*No space left on device.*full\?"):
        build(model, config)
    assert [path.name for path in (tmp_path / "cache").iterdir() if not path.name.endswith(".lock")] == []
