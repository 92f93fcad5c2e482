"""``python -m benchmarks [name ...]``: run the benchmark modules here (all, or ``local``, ``sweep``, ...) and print
one table of their rows at the end (each module also prints its own details as it goes)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from pathlib import Path

from benchmarks.common import Row, format_table


def main(argv: list[str] | None = None) -> int:
    wanted = set(sys.argv[1:] if argv is None else argv)
    failures = 0
    rows: list[Row] = []
    for module_info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        name = module_info.name
        if not name.startswith("bench_") or (wanted and name.removeprefix("bench_") not in wanted):
            continue
        print(f"== {name}", flush=True)
        try:
            rows += importlib.import_module(f"benchmarks.{name}").main([]) or []
        except Exception:  # one broken benchmark must not hide the others
            failures += 1
            traceback.print_exc()
    print("\n== all benchmarks (min / median over interleaved rounds; ratio = after / before of the medians)")
    print(format_table(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
