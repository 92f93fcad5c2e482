"""Override text (``key=value``, ``+key=value``, ``~key``), read and written only here: Hydra's grammar, the split
of text that is not Hydra's grammar yet, and :func:`hydra_value` to write a value Hydra reads back."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dataflex_rl.validation import ConfigError

_PREFIXES = ("++", "+", "~")


@dataclasses.dataclass(frozen=True)
class Override:
    """One override as Hydra's grammar reads it."""

    key: str
    value: str | None = None
    prefix: str = ""
    package: str | None = None
    sweep: tuple[str, ...] | None = None
    text: str = ""
    typed: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def group(self) -> str:
        """The first part of the key (``trainer`` of ``trainer.lr``): the config block or group it changes."""
        return self.key.split(".", 1)[0]

    @property
    def written_value(self) -> str | None:
        """The value as written (quotes kept), None without ``=``."""
        return split_assignment(self.text)[1]

    def __str__(self) -> str:
        return self.text


def parse_override(text: str, where: str | None = None) -> Override:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:  # bytes the environment could not decode (surrogate escapes)
        raise ConfigError(f"{where or repr(text)} is not allowed: it is not valid UTF-8 (byte "
                          f"{ord(text[error.start]) - 0xDC00:#04x} at character {error.start}); every value is "
                          f"recorded as UTF-8 text") from None
    try:
        parsed = OverridesParser.create().parse_override(text)
    except HydraException as error:
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(f"{where or repr(text)} is not allowed: Hydra's override grammar cannot read it "
                          f"({reason})") from None
    element = parsed.get_key_element()
    prefix = next((item for item in _PREFIXES if element.startswith(item)), "")
    if parsed.is_sweep_override():
        try:
            values = tuple(dict.fromkeys(parsed.sweep_string_iterator()))
        except HydraException:  # glob(...) and interval(...) list nothing to run
            raise ConfigError(f"{where or repr(text)} is not allowed: an axis lists its values (key=a,b, choice(a,b) "
                              f"or range(start,stop[,step])); glob(...) and interval(...) give no list of values to "
                              f"run") from None
        return Override(parsed.key_or_group, None, prefix, parsed.package, values, text)
    value = None
    if "=" in text:
        try:
            value = parsed.get_value_element_as_str()
        except Exception:  # noqa: BLE001  (a list holding a sweep, [range(0,1)], has no one text: keep it as written)
            value = split_assignment(text)[1]
    return Override(parsed.key_or_group, value, prefix, parsed.package, None, text, parsed.value())


def override_key(text: str) -> str:
    """The bare key of an override text (``++trainer.lr=1e-3`` -> ``trainer.lr``), also of text Hydra cannot read."""
    try:
        return parse_override(text).key
    except ConfigError:
        return bare_assignment(text)[0]


def split_assignment(text: str) -> tuple[str, str | None]:
    """``"key=value"`` -> ``("key", "value")``, ``"word"`` -> ``("word", None)``, for text not in Hydra's grammar."""
    key, equals, value = text.partition("=")
    return key, value if equals else None


def bare_assignment(text: str) -> tuple[str, str | None]:
    """:func:`split_assignment` with the key's prefix dropped: ``"++a.b=1"`` -> ``("a.b", "1")``."""
    key, value = split_assignment(text)
    prefix = next((item for item in _PREFIXES if key.startswith(item)), "")
    return key.removeprefix(prefix), value


_NOT_IN_CONFIG = re.compile(r"Could not override '([^']+)'")


def unknown_override_message(error: BaseException, overrides: Sequence[str], compose: Any) -> str | None:
    """Hydra's refusal of a key the config lacks (``Could not override 'trainer.lrr'``) in the project's form."""
    found = _NOT_IN_CONFIG.search(str(error))
    if not found:
        return None
    key = found.group(1)
    given = [item for item in overrides if override_key(item) == key]
    value = split_assignment(given[-1])[1] if given else None
    parent, _, leaf = key.rpartition(".")
    try:
        from omegaconf import DictConfig, OmegaConf

        base = compose([item for item in overrides if item not in given])
        node = OmegaConf.select(base, parent) if parent else base
        allowed = [str(name) for name in node.keys()] if isinstance(node, DictConfig) else None
    except Exception:  # noqa: BLE001  (the listing is a courtesy; the refusal stands without it)
        allowed = None
    message = f"{key} = {value!r} is not allowed: {parent or 'the config'} has no key {leaf!r}"
    if allowed is not None:
        message += f"; allowed keys{' of ' + parent if parent else ''}: {', '.join(allowed)}"
    return message


# Hydra override values: text that needs no quotes, and words Hydra would read as another type.
_PLAIN_VALUE = re.compile(r"[A-Za-z_/][\w\-./]*")
_HYDRA_RESERVED = {"true", "false", "null", "nan", "inf", "-inf"}


def hydra_value(value: Any) -> str:
    """``value`` written in Hydra's override grammar, strings quoted only when they need it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    text = str(value)
    if _PLAIN_VALUE.fullmatch(text) and text.lower() not in _HYDRA_RESERVED:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
