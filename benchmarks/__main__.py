"""``python -m benchmarks [name ...]``: run the benchmark modules here (all, or ``local``, ``sweep``, ...) and print
one table of their rows at the end (each module also prints its own details as it goes)."""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from benchmarks.common import format_table
from dataflex_rl.registry import plugin_modules


def main(argv: list[str] | None = None) -> int:
    modules = plugin_modules("benchmarks", prefix="bench_")
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name", help=f"one of {', '.join(modules)} (default: all)")
    names = parser.parse_args(argv).names
    if set(names) - set(modules):
        parser.error(f"unknown benchmark {', '.join(sorted(set(names) - set(modules)))}; allowed: {', '.join(modules)}")
    wanted = [name for name in modules if name in names or not names]
    rows, failures = [], 0
    for name in wanted:
        print(f"== bench_{name}", flush=True)
        try:
            rows += importlib.import_module(modules[name]).main([])
        except Exception:  # one broken benchmark must not hide the others
            failures += 1
            traceback.print_exc()
    print("\n== all benchmarks (min / median over interleaved rounds; ratio = after / before of the medians)")
    print(format_table(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
