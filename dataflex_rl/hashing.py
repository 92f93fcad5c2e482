"""The project's one stable hash: sha256 over canonical JSON (keys sorted, no spaces), in hex, truncated."""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

from dataflex_rl.validation import to_plain


def _json_default(value: Any) -> str:
    if isinstance(value, pathlib.PurePath):
        return str(value)
    raise TypeError(f"value {value!r} of type {type(value).__name__} cannot be hashed: use plain YAML types")


def canonical_json(value: Any) -> str:
    """``value`` (dicts, ``DictConfig``, lists, scalars, paths) as JSON with sorted keys and no spaces."""
    return json.dumps(to_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True,
                      default=_json_default)


def stable_hash(value: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of sha256 over :func:`canonical_json` (a ``str`` is hashed as is)."""
    text = value if isinstance(value, str) else canonical_json(value)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]
