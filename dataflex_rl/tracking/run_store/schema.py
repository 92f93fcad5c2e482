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


def _check(holds: Callable[[Any], bool], wanted: str) -> Check:
    return lambda value: None if holds(value) else wanted


def _or_null(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


text = _check(lambda value: isinstance(value, str) and bool(value), "a non-empty string")
optional_text = _check(lambda value: value is None or isinstance(value, str), "a string or null")
integer = _check(lambda value: isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0,
                 "an integer >= 0")
number = _check(lambda value: isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value),
                "a finite number")
state = _check(lambda value: value in STATES, f"one of {', '.join(STATES)}")
mapping = _check(lambda value: isinstance(value, Mapping), "a JSON object")


def entries(*required: str) -> Check:
    """A list of objects, each holding ``required`` as non-empty strings."""
    def check(value: Any) -> str | None:
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            return "a list of JSON objects"
        for index, item in enumerate(value):
            missing = [key for key in required if text(item.get(key)) is not None]
            if missing:
                why = "lacks" if missing[0] not in item else f"holds {item[missing[0]]!r}, not a non-empty string, in"
                return f"a list of objects each with {', '.join(required)} (entry {index} {why} {missing[0]!r})"
        return None
    return check


# key -> (required, check)
STATUS = {"state": (True, state), "step": (True, _or_null(integer)), "updated": (False, optional_text),
          "error": (False, optional_text), "traceback": (False, optional_text)}
META = {"sweep": (True, text), "run": (True, text), "backend": (True, text), "mechanism": (True, text),
        "alpha": (True, number), "seed": (True, integer), "config_hash": (True, text),
        "config_fingerprint": (False, optional_text), "git_commit": (False, optional_text),
        "axes": (False, mapping), "wall_time_s": (False, _or_null(number))}
SWEEP = {"sweep": (False, text), "grid": (False, mapping), "runs": (False, entries("run")),
         "warm_starts": (False, entries("run")), "invocations": (False, entries()), "plan": (False, mapping),
         "steps": (False, _or_null(integer)), "jobs": (False, _or_null(integer))}
boolean = _check(lambda value: value is None or isinstance(value, bool), "true, false or null")
SFT_DONE_FILE = "done.json"  # written last into a warm start's folder: its outcome, its files and their hashes
SFT_DONE = {"steps": (True, integer), "seconds": (True, number), "final_loss": (False, _or_null(number)),
            "target_accuracy": (False, _or_null(number)), "check_accuracy": (False, _or_null(number)),
            "reached": (False, boolean)}


def check_schema(path: pathlib.Path, payload: dict[str, Any], schema: Mapping[str, tuple[bool, Check]]) -> dict:
    """``payload`` when every key of ``schema`` holds what it must; else :class:`RunStoreError` naming the first."""
    for key, (required, check) in schema.items():
        if key not in payload:
            if required:
                raise RunStoreError(f"{path} has no {key!r}: it must hold {check(None) or 'a value'}")
            continue
        wanted = check(payload[key])
        if wanted is not None:
            shown = repr(payload[key])
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise RunStoreError(f"{path}: {key} = {shown} is not allowed: it must be {wanted}")
    return payload
