"""``python -m benchmarks``: run every benchmark module here in turn (each prints its own side-by-side ratios)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path


def main() -> int:
    failures = 0
    for module_info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if not module_info.name.startswith("bench_"):
            continue
        print(f"== {module_info.name}", flush=True)
        try:
            importlib.import_module(f"benchmarks.{module_info.name}").main([])
        except Exception:  # one broken benchmark must not hide the others
            failures += 1
            traceback.print_exc()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
