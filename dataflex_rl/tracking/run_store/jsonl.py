"""The jsonl files: one record per line, appended with one ``write(2)`` each; the partial last line a hard kill leaves
is dropped by readers and cut before the next append."""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any, BinaryIO

from dataflex_rl.tracking.run_store.files import RunStoreError

LOG = logging.getLogger(__name__)


def dumps_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, allow_nan=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def read_jsonl(path: str | os.PathLike[str], *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """Records of a run-store jsonl file (``[]`` when missing)."""
    records, _ = read_jsonl_with_tail(pathlib.Path(path), skip_bad=skip_bad)
    return records


def read_jsonl_with_tail(path: pathlib.Path, skip_bad: bool = False) -> tuple[list[dict[str, Any]], bool]:
    """``(records, whether a partial last line was dropped)``; otherwise as :func:`read_jsonl`."""
    if not path.exists():
        return [], False
    lines = path.read_bytes().split(b"\n")
    # A file ending in "\n" leaves an empty last element; anything else there is a line without its newline.
    tail = lines.pop()
    records = []
    bad_lines = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _parse_record(line)
        if record is None:
            if not skip_bad:
                raise RunStoreError(f"{path}: line {number} is not a run-store record: {line[:200]!r}")
            bad_lines.append(number)
            continue
        records.append(record)
    if bad_lines:
        LOG.warning("%s: skipped %d unreadable line(s): %s", path, len(bad_lines), bad_lines[:5])
    dropped = False
    if tail.strip():
        record = _parse_record(tail)
        if record is None:
            LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path, len(tail))
            dropped = True
        else:
            records.append(record)
    return records, dropped


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return record if isinstance(step, int) and not isinstance(step, bool) else None


def _repair_tail(path: pathlib.Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if _parse_record(data[cut:]) is not None:
            handle.seek(0, os.SEEK_END)
            handle.write(b"\n")
        else:
            LOG.warning("%s: dropped a partial last line (%d bytes) left by an interrupted write", path,
                        len(data) - cut)
            handle.truncate(cut)


def open_for_append(path: pathlib.Path) -> BinaryIO:
    """``path`` opened unbuffered for appending (one ``write(2)`` per record), a partial last line cut."""
    _repair_tail(path)
    return open(path, "ab", buffering=0)  # noqa: SIM115 - the caller owns the handle


def append_record(handle: BinaryIO, record: Mapping[str, Any]) -> None:
    data = memoryview(dumps_line(record))
    while data:  # a raw write may be short (signal, near-full disk): write the rest
        data = data[handle.write(data) :]


class JsonlTail:
    """The records appended to a jsonl file since the last :meth:`read`, while the run writes it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        """New complete records (dicts with an integer ``step``); [] when the file does not exist yet."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset, self.partial = 0, b""
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        return [record for record in map(_parse_record, lines) if record is not None]
