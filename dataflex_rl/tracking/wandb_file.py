"""Read an offline W&B run file (``run-<id>.wandb``): history, config, names, tags and exit code (W&B ships no
Python reader for these files)."""

from __future__ import annotations

import json
import pathlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from wandb.proto import wandb_internal_pb2

# The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1 little-endian, version 0), then 32 KiB
# blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last); a block tail
# shorter than 7 bytes is padding. Each reassembled record is a ``wandb_internal_pb2.Record``.
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | pathlib.Path) -> Iterator[wandb_internal_pb2.Record]:
    path = pathlib.Path(path)
    data = path.read_bytes()
    if data[:4] != b":W&B" or struct.unpack("<H", data[4:6])[0] != 0xBEE1:
        raise ValueError(f"{path} is not a W&B run file (no ':W&B' header with magic 0xBEE1)")
    position, pending = 7, b""
    while position + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK_SIZE - position % BLOCK_SIZE
        if left_in_block < CHUNK_HEADER.size:
            position += left_in_block
            continue
        _crc, length, kind = CHUNK_HEADER.unpack_from(data, position)
        if length == 0 and kind == 0:  # zero padding up to the end of the block
            position += left_in_block
            continue
        if position + CHUNK_HEADER.size + length > len(data):  # still being written
            return
        chunk = data[position + CHUNK_HEADER.size : position + CHUNK_HEADER.size + length]
        position += CHUNK_HEADER.size + length
        if kind in (FIRST, MIDDLE):
            pending = chunk if kind == FIRST else pending + chunk
            continue
        payload, pending = (chunk, pending) if kind == FULL else (pending + chunk, b"")
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def history(path: str | pathlib.Path) -> dict[int, dict[str, Any]]:
    """step -> {key: decoded value} of every history row, without W&B's ``_``-prefixed keys."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = rows.setdefault(record.history.step.num, {})
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                row[key] = json.loads(item.value_json)
    return rows


def _config_items(items: Any, into: dict[str, Any]) -> None:
    for item in items:
        key = item.key or ".".join(item.nested_key)
        value = json.loads(item.value_json)
        into[key] = value.get("value", value) if isinstance(value, dict) and set(value) <= {"value", "desc"} else value


@dataclass
class OfflineRun:
    """What an offline run file says about its run (``exit_code`` None: no exit record, the run did not end)."""

    path: pathlib.Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def read_run(path: str | pathlib.Path) -> OfflineRun:
    """The run record (id, name, group, job type, tags, config), later config updates and the exit code."""
    run = OfflineRun(path=pathlib.Path(path))
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.name, run.group = record.run.run_id, record.run.display_name, record.run.run_group
            run.job_type, run.tags = record.run.job_type, tuple(record.run.tags)
        if kind in ("run", "config"):  # the run's config, then its later updates
            _config_items((record.run.config if kind == "run" else record.config).update, run.config)
        elif kind == "exit":
            run.exit_code = int(record.exit.exit_code)
    return run


def run_files(root: str | pathlib.Path) -> list[pathlib.Path]:
    """Offline run files under ``root`` (``.../wandb/offline-run-*/run-*.wandb``), sorted by path."""
    return sorted(pathlib.Path(root).rglob("offline-run-*/run-*.wandb"))
