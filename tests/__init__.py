import contextlib
from collections.abc import Iterator

from dataflex_rl.registry import Registry


@contextlib.contextmanager
def registry_snapshot(registry: Registry) -> Iterator[None]:
    """Restore the registry's entries on exit (for tests that register throwaway components)."""
    saved = dict(registry._entries)
    try:
        yield
    finally:
        registry._entries.clear()
        registry._entries.update(saved)
