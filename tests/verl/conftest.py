"""Fixtures for the verl backend tests: verl's composed config and an in-memory TransferQueue.

verl cannot run end to end on a CPU, so the trainer is tested as verl's own CPU tests test trainer steps: a trainer
built without ``__init__`` and the TransferQueue calls (``kv_batch_get``/``kv_batch_put``) answered from memory, in
the same shapes the real queue uses (one jagged nested tensor ``(bs, j)`` per response field, strings as a
non-tensor stack).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import transfer_queue
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorStack
from transfer_queue import KVBatchMeta

from dataflex_rl.verl.command import build_verl_command

VERL_CONFIG_DIR = Path(verl.__file__).resolve().parent / "trainer" / "config"
# Placeholders: compose and validation only read the strings, nothing is loaded from them.
MODEL_PATH = "/models/Qwen2.5-3B-Instruct"
DATA_DIR = "/data/kk"


def compose_verl_config(overrides: Sequence[str]) -> DictConfig:
    """verl's ``ppo_trainer`` config with command-line overrides, as ``python -m verl.trainer.main_ppo`` builds it."""
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def experiment_overrides(dataflex_overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """The verl overrides of ``verl_kk_3b`` (everything after ``-m verl.trainer.main_ppo``)."""
    variables = [f"model={MODEL_PATH}", f"data_dir={DATA_DIR}"]
    command = build_verl_command("verl_kk_3b", dataflex_overrides, [*variables, *extra])
    return command[command.index("verl.trainer.main_ppo") + 1 :]


@pytest.fixture(scope="session")
def compose_verl():
    """:func:`compose_verl_config` (for test modules, which cannot import this conftest)."""
    return compose_verl_config


@pytest.fixture(scope="session")
def kk_overrides():
    """:func:`experiment_overrides` (for test modules, which cannot import this conftest)."""
    return experiment_overrides


@pytest.fixture(scope="session")
def composed_experiment_config() -> DictConfig:
    config = compose_verl_config(experiment_overrides())
    OmegaConf.resolve(config)  # verl's TaskRunner resolves the config before building the trainer
    return config


@pytest.fixture
def verl_config(composed_experiment_config: DictConfig) -> DictConfig:
    """A private copy of the composed ``verl_kk_3b`` config (tests may change it)."""
    return copy.deepcopy(composed_experiment_config)


class InMemoryTransferQueue:
    """Rows ``key -> {field: 1-D tensor | str}`` answering ``kv_batch_get``/``kv_batch_put`` like TransferQueue."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, object]] = {}
        self.puts: list[tuple[str, ...]] = []  # the fields of every kv_batch_put, in order

    def add(self, partition_id: str, key: str, **fields: object) -> None:
        self.rows[(partition_id, key)] = dict(fields)

    def row(self, partition_id: str, key: str) -> dict[str, object]:
        return self.rows[(partition_id, key)]

    def kv_batch_get(
        self, keys: list[str], partition_id: str, select_fields: Sequence[str] | None = None
    ) -> TensorDict:
        rows = [self.rows[(partition_id, key)] for key in keys]
        names = list(rows[0]) if select_fields is None else [name for name in select_fields if name in rows[0]]
        columns = {}
        for name in names:
            values = [row[name] for row in rows]
            if isinstance(values[0], torch.Tensor):
                columns[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            else:
                columns[name] = NonTensorStack(*values)
        return TensorDict(columns, batch_size=len(keys))

    def kv_batch_put(
        self, keys: list[str], partition_id: str, fields: TensorDict | None = None, tags: list | None = None
    ) -> KVBatchMeta:
        names = tuple(fields.keys()) if fields is not None else ()
        self.puts.append(names)
        for name in names:
            column = fields[name]
            values = column.unbind() if isinstance(column, torch.Tensor) else column.tolist()
            for key, value in zip(keys, values, strict=True):
                self.rows[(partition_id, key)][name] = value.clone() if isinstance(value, torch.Tensor) else value
        stored = sorted(self.rows[(partition_id, keys[0])])
        return KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id, fields=stored)


class TransferQueueSwitch:
    """Stands in for the ``transfer_queue`` module's KV calls, answering from the queue made current by :meth:`new`."""

    def __init__(self) -> None:
        self.current: InMemoryTransferQueue | None = None

    def new(self) -> InMemoryTransferQueue:
        """A fresh, empty queue; from now on every ``tq.kv_batch_*`` call goes to it."""
        self.current = InMemoryTransferQueue()
        return self.current

    def use(self, queue: InMemoryTransferQueue) -> InMemoryTransferQueue:
        self.current = queue
        return queue

    def kv_batch_get(self, *args, **kwargs) -> TensorDict:
        return self.current.kv_batch_get(*args, **kwargs)

    def kv_batch_put(self, *args, **kwargs) -> KVBatchMeta:
        return self.current.kv_batch_put(*args, **kwargs)


@pytest.fixture
def queues(monkeypatch: pytest.MonkeyPatch) -> TransferQueueSwitch:
    """In-memory TransferQueues answering verl's and the trainer's ``tq.kv_batch_*`` calls."""
    switch = TransferQueueSwitch()
    monkeypatch.setattr(transfer_queue, "kv_batch_get", switch.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", switch.kv_batch_put)
    return switch


@pytest.fixture(autouse=True)
def _no_datasets_cache_in_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HF ``datasets`` (used by verl's RLHFDataset) caches under ``$HOME`` by default: keep it in ``tmp_path``."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(tmp_path) / "hf-datasets")
    monkeypatch.setenv("HF_DATASETS_CACHE", os.fspath(Path(tmp_path) / "hf-datasets"))
