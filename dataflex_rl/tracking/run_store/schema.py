"""What each JSON file of the record holds (docs/run_store.md): a reader checks a file against its schema and raises
:class:`RunStoreError` naming the file, the key and the value that fail it, so no caller crashes on a bad value or
repairs it in silence."""

from __future__ import annotations

import math
import numbers
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from dataflex_rl.tracking.run_store.files import RunStoreError
from dataflex_rl.tracking.run_store.status import STATES

# A check returns what the value must be when it fails, else None.
Check = Callable[[Any], str | None]


def text(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "a non-empty string"


def optional_text(value: Any) -> str | None:
    return None if value is None or isinstance(value, str) else "a string or null"


def integer(value: Any) -> str | None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
    return None if ok else "an integer >= 0"


def optional_integer(value: Any) -> str | None:
    return None if value is None else integer(value)


def number(value: Any) -> str | None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    return None if ok else "a finite number"


def optional_number(value: Any) -> str | None:
    return None if value is None else number(value)


def state(value: Any) -> str | None:
    return None if value in STATES else f"one of {', '.join(STATES)}"


def mapping(value: Any) -> str | None:
    return None if isinstance(value, Mapping) else "a JSON object"


def entries(*required: str) -> Check:
    """A list of objects, each holding ``required`` as non-empty strings."""
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            return "a list of JSON objects"
        for index, item in enumerate(value):
            missing = [key for key in required if text(item.get(key)) is not None]
            if missing:
                return f"a list of objects each with {', '.join(required)} (entry {index} lacks {missing[0]!r})"
        return None
    return check


# key -> (required, check)
STATUS = {"state": (True, state), "step": (True, optional_integer), "updated": (False, optional_text),
          "error": (False, optional_text), "traceback": (False, optional_text)}
META = {"sweep": (True, text), "run": (True, text), "backend": (True, text), "mechanism": (True, text),
        "alpha": (True, number), "seed": (True, integer), "config_hash": (True, text),
        "config_fingerprint": (False, optional_text), "git_commit": (False, optional_text),
        "axes": (False, mapping), "wall_time_s": (False, optional_number)}
SWEEP = {"sweep": (False, text), "grid": (False, mapping), "runs": (False, entries("run")),
         "warm_starts": (False, entries("run")), "invocations": (False, entries()), "plan": (False, mapping),
         "steps": (False, optional_integer), "jobs": (False, optional_integer)}
SFT_DONE = {"steps": (True, integer), "seconds": (True, number), "final_loss": (False, optional_number)}


def check_schema(path: pathlib.Path, payload: dict[str, Any], schema: Mapping[str, tuple[bool, Check]]) -> dict:
    """``payload`` when every key of ``schema`` holds what it must; else :class:`RunStoreError` naming the first."""
    for key, (required, check) in schema.items():
        if key not in payload:
            if required:
                raise RunStoreError(f"{path} has no {key!r}: it must hold {check(None) or 'a value'}")
            continue
        wanted = check(payload[key])
        if wanted is not None:
            raise RunStoreError(f"{path}: {key} = {_shown(payload[key])} is not allowed: it must be {wanted}")
    return payload


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."
