"""Name -> component registries, one per kind, filled by decorators (``@SCORERS.register("token_prob")``); a
dotted path ``pkg.module:Attr`` loads an out-of-tree component without registering it."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """Unknown or duplicate registry name. ``str()`` is the plain message (KeyError would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A name -> object map for one kind of component (``scorer``, ``actuator``, ``task``, ``logger`` ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` (a class's ``name`` is set to it)."""
        if not isinstance(name, str) or not name or ":" in name:
            raise ValueError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")

        def decorator(obj: T) -> T:
            if name in self._entries:
                owner = self._entries[name]
                where = f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', repr(owner))}"
                raise RegistryError(f"{self.kind} {name!r} is already registered (by {where}); pick another name")
            self._entries[name] = obj
            if isinstance(obj, type):
                obj.name = name
            return obj

        return decorator

    def get(self, name: str) -> T:
        if not isinstance(name, str):
            raise RegistryError(f"{self.kind} name must be a string, got {name!r}; registered: {self.names()}")
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            obj = _load_dotted(self.kind, name)
            if isinstance(obj, type) and "name" not in vars(obj):
                obj.name = name  # its own name, not a registered parent's, in messages
            return obj
        raise RegistryError(
            f"unknown {self.kind} {name!r}; registered {self.kind}s: {', '.join(self.names()) or '(none)'}; "
            f"or give a dotted path 'package.module:Name'"
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


def plugin_modules(package: str, prefix: str = "", suffix: str = "") -> dict[str, str]:
    """The in-tree plugin modules of ``package``, ``{name: dotted module}`` for ``<prefix><name><suffix>``."""
    locations = getattr(importlib.import_module(package), "__path__", None)  # the live path (it may be extended)
    if locations is None:
        raise RegistryError(f"{package!r} is not a package")
    return dict(sorted((info.name[len(prefix): len(info.name) - len(suffix)], f"{package}.{info.name}")
                       for info in pkgutil.iter_modules(locations) if not info.name.startswith("_")
                       and info.name.startswith(prefix) and info.name.endswith(suffix)))


def _load_dotted(kind: str, path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryError(f"cannot import module {module_name!r} for {kind} {path!r}: {error}") from error
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError as error:
        raise RegistryError(f"module {module_name!r} has no attribute {attr!r} (for {kind} {path!r})") from error
