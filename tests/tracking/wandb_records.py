"""Read back an offline W&B run file (``run-<id>.wandb``) for tests.

W&B 0.31 ships no Python reader. The file is a LevelDB-style log: a 7-byte file header (``:W&B``, magic 0xBEE1
little-endian, version 0), then 32 KiB blocks of chunks, each with a 7-byte header (crc32 uint32, length uint16,
type uint8: 1 full, 2 first, 3 middle, 4 last); a block tail shorter than 7 bytes is padding. Each reassembled
record is a ``wandb_internal_pb2.Record`` protobuf.
"""

from __future__ import annotations

import json
import pathlib
import struct
import time
from collections.abc import Iterator
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: pathlib.Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, f"{path} is not a W&B run file"
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
        if kind == FULL:
            payload = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        else:
            payload, pending = pending + chunk, b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def history(path: pathlib.Path) -> dict[int, dict[str, Any]]:
    """step -> {key: decoded value} of every history row, without W&B's own ``_``-prefixed keys.

    Nested values (a histogram) come back as ``{"h/_type": "histogram", "h/values": [...], "h/bins": [...]}``.
    """
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


def run_file(run_dir: pathlib.Path, run_id: str, patience_s: float = 60.0) -> pathlib.Path:
    """The single offline run file of ``run_id`` under ``run_dir/wandb``, once it holds the run's exit record.

    ``run.finish()`` returns when wandb-core has handled the exit, but wandb-core may write the file's last records
    a moment later, so this waits (up to ``patience_s``, a generous bound, not a speed check) for the exit record.
    """
    found = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(found) == 1, f"expected one offline run file for {run_id}, found {found}"
    deadline = time.monotonic() + patience_s
    while True:
        kinds = [record.WhichOneof("record_type") for record in records(found[0])]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "exit" in kinds, f"{found[0]} has no exit record after {patience_s} s; records: {kinds}"
    return found[0]
