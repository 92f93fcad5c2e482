"""``python -m benchmarks [name ...] [--name RESULTS]``: run the benchmark modules here (all, or ``local``, ``sweep``,
...) and print one table of their rows at the end (each module also prints its own details as it goes); ``--name``
also writes the table as ``docs/results/<RESULTS>.md`` with the machine and its load, and the docs blocks showing it."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import traceback

from benchmarks.common import format_table
from dataflex_rl.registry import plugin_modules


def main(argv: list[str] | None = None) -> int:
    modules = plugin_modules("benchmarks", prefix="bench_")
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="name", help=f"one of {', '.join(modules)} (default: all)")
    parser.add_argument("--name", dest="results", help="also write the table as docs/results/<RESULTS>.md")
    argv = list(sys.argv[1:] if argv is None else argv)
    options = parser.parse_args(argv)
    names = options.names
    if set(names) - set(modules):
        parser.error(f"unknown benchmark {', '.join(sorted(set(names) - set(modules)))}; allowed: {', '.join(modules)}")
    if options.results is not None:
        from analysis.results import check_results_name

        try:
            check_results_name(options.results, "--name")
        except ValueError as error:
            parser.error(str(error))
    wanted = [name for name in modules if name in names or not names]
    load_before, rows, failures = os.getloadavg()[0], [], 0
    for name in wanted:
        print(f"== bench_{name}", flush=True)
        try:
            rows += importlib.import_module(modules[name]).main([])
        except Exception:  # one broken benchmark must not hide the others
            failures += 1
            traceback.print_exc()
    print("\n== all benchmarks (min / median over interleaved rounds; ratio = after / before of the medians)")
    table = format_table(rows)
    print(table)
    if options.results is not None and not failures:
        from analysis.results import publish

        text = results_text(options.results, argv, table, (load_before, os.getloadavg()[0]))
        path, changed = publish(options.results, lambda: text)
        print(f"results: {path}" + (f"; docs updated: {', '.join(map(str, changed))}" if changed else ""))
    return 1 if failures else 0


def results_text(name: str, argv: list[str], table: str, load: tuple[float, float]) -> str:
    """The results file: the command that wrote it, the table, and the machine with its 1-minute load average at the
    start and the end (a shared machine's absolute times are slower; the ratios come from interleaved rounds)."""
    return "\n".join([f"<!-- {name}: written by `python -m benchmarks {' '.join(argv)}`; do not edit by hand -->", "",
                      table, "", f"- machine: {platform.machine()}, {os.cpu_count()} cores; load average (1 min) "
                      f"{load[0]:.1f} at the start, {load[1]:.1f} at the end", ""])


if __name__ == "__main__":
    sys.exit(main())
