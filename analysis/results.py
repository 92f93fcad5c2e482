"""Results files: ``python -m analysis.results runs/<sweep> --name <name>`` (``make docs-results``) writes
``docs/results/<name>.md`` from a sweep and rewrites every ``<!-- results: <name> -->`` block of the docs with it;
``--check`` fails when a block differs from its file. A block is that line, its body and a line
``<!-- /results -->``; a doc with any other text that starts like a marker is refused by both, naming the line.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from analysis.aggregate import aggregate_runs, default_baseline, default_group_keys, paired_differences, run_summaries
from analysis.frames import SweepData
from analysis.load import load_sweep
from analysis.collapse import CollapseRule
from analysis.statistics import DEFAULT_CONFIDENCE
from analysis.report import collapse_lines, summary_table, with_group_columns
from analysis.tables import comparison_table, to_markdown
from analysis.warm_starts import design_sentence
from dataflex_rl import keys
from dataflex_rl.tracking import run_store
from dataflex_rl.tracking.run_store import atomic_write_bytes
from dataflex_rl.validation import ConfigError, check_file_name

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "docs" / "results"
ARCHIVE = "archive"  # docs/results/archive.md: superseded results, kept by hand with the commit that wrote each
# The mechanism's figures per group (time-averaged, then over seeds); the last: the share of confident tokens
# (pi >= 0.75) with a negative advantage whose pi the update lowered (the paper's "why").
MECHANISM_METRICS = (keys.GRAD_LOW_PROB_SHARE, keys.GRAD_NORM, keys.GRAD_CLIP_FRAC,
                     keys.prob_change("neg", keys.bucket_label(0.75, 1.0), "correct_share"))
# Anything that starts like a marker must be a whole line, one of the two below.
_MARKER_LIKE = re.compile(r"<!--\s*/?\s*results\b", re.IGNORECASE)
_OPENING = re.compile(r"<!-- results: (?P<name>\S*) -->")
_CLOSING = "<!-- /results -->"


def machine_lines(data: SweepData) -> list[str]:
    """Each numeric environment with its run count, torch's version, and the sweep's wall time."""
    included = data.included_runs
    environments = included["environment"].fillna("unknown").astype(str).value_counts()
    lines = [f"- numeric environment: `{label}` ({count} run{'s' if count > 1 else ''})"
             for label, count in environments.items()]
    versions = {(run_store.read_meta(path) or {}).get("versions", {}).get("torch") for path in included["path"]}
    lines.append(f"- torch {', '.join(sorted(str(version) for version in versions))}")
    manifest = data.manifest or {}
    seconds = sum((pd.Timestamp(item["end"]) - pd.Timestamp(item["start"])).total_seconds()
                  for item in manifest.get("invocations", []) if item.get("start") and item.get("end"))
    if seconds:
        lines.append(f"- the sweep's wall time: {int(seconds // 60)} min {int(seconds % 60)} s over "
                     f"{len(manifest['invocations'])} invocation(s), {manifest.get('jobs')} run(s) at once, "
                     f"{manifest.get('threads')} thread(s) each")
    return lines


def results_text(data: SweepData, name: str, sweep_dir: Path) -> str:
    included = data.included_runs
    commits = sorted({str(commit)[:7] for commit in included["git_commit"].dropna()})
    parts = [f"<!-- {name}: written by `make docs-results SWEEP={sweep_dir.name} RESULTS={name}` from "
             f"{len(included)} runs of sweep {sweep_dir.name} (commit {', '.join(commits) or 'unknown'}); do not edit "
             f"by hand -->", ""]
    headline = summary_table(data)
    if headline is None:
        raise ValueError(f"sweep {sweep_dir} has no included run that logged {keys.VAL_ACCURACY}: nothing to write")
    parts += [to_markdown(headline), "", design_sentence(data), ""]
    group_keys = tuple(default_group_keys(data.included_runs))
    collapse = collapse_lines(with_group_columns(data, group_keys), group_keys, CollapseRule(), DEFAULT_CONFIDENCE)
    if collapse is not None:
        parts += ["Collapse:", "", *collapse[2]]
    metrics = [metric for metric in MECHANISM_METRICS if metric in set(data.metric_names)]
    if metrics:
        summaries = run_summaries(with_group_columns(data, group_keys).metrics, metrics=metrics)
        baseline = default_baseline(summaries, group_keys)
        deltas = None if baseline is None else paired_differences(summaries, value="auc", group_keys=group_keys,
                                                                  baseline=baseline)
        table = comparison_table(aggregate_runs(summaries, value="auc", group_keys=group_keys), deltas=deltas,
                                 metrics=metrics, group_keys=group_keys,
                                 caption="the mechanism, time-averaged over training")
        parts += ["The mechanism, each run's time average over its steps (mean over seeds, paired Δ):", "",
                  to_markdown(table), ""]
    parts += ["Measured on:", "", *machine_lines(data), ""]
    return "\n".join(parts)


def doc_files(root: Path = REPO) -> list[Path]:
    """``README.md`` and ``docs/**/*.md``, the results files aside."""
    return [root / "README.md", *sorted(path for path in (root / "docs").rglob("*.md")
                                        if root / "docs" / "results" not in path.parents)]


def block_spans(text: str, where: str = "") -> list[tuple[str, int, int]]:
    """``(name, start, end)`` of every results block's body in a Markdown text (``text[start:end]``); ValueError
    naming ``where`` and the line when a marker is not well formed: not a whole line, a name that is not a results
    name, a block opened inside another, a closing line with no block open, a block never closed."""
    spans, opened = [], None
    for match in _MARKER_LIKE.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.start())
        end = len(text) if end < 0 else end
        line, at = text[start:end], f"{where}:{text.count(chr(10), 0, start) + 1}"
        opening = _OPENING.fullmatch(line)
        if start != match.start() or not (opening or line == _CLOSING):
            raise ValueError(f"{at}: {line[:80]!r} is not a results marker: a block is a line '<!-- results: <name> "
                             f"-->', its body, then a line '{_CLOSING}'")
        if opening:
            name = check_results_name(opening["name"], f"{at}: the block's name")
            if opened is not None:
                raise ValueError(f"{at}: block {name!r} opens inside block {opened[0]!r} ({opened[2]}), which has no "
                                 f"'{_CLOSING}' line before it")
            opened = (name, min(end + 1, len(text)), at)
        elif opened is None:
            raise ValueError(f"{at}: '{_CLOSING}' closes no block")
        else:
            spans.append((opened[0], opened[1], start))
            opened = None
    if opened is not None:
        raise ValueError(f"{opened[2]}: block {opened[0]!r} has no '{_CLOSING}' line")
    return spans


def _doc(path: Path, root: Path) -> tuple[str, list[tuple[str, int, int]]]:
    """A doc's text and its blocks; ValueError naming it when it is not UTF-8 or a marker is not well formed."""
    where = str(path.relative_to(root))
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{where}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return text, block_spans(text, where)


def stale_blocks(root: Path = REPO) -> list[str]:
    """Every docs block that differs from its results file (or names none), as ``<doc>: <name> (<why>)``, and
    every marker that is not well formed."""
    problems = []
    for path in doc_files(root):
        try:
            text, spans = _doc(path, root)
        except ValueError as error:
            problems.append(str(error))
            continue
        for name, start, end in spans:
            results = root / "docs" / "results" / f"{name}.md"
            if not results.is_file():
                problems.append(f"{path.relative_to(root)}: {name} (no {results.relative_to(root)})")
            elif results.read_bytes() != text[start:end].encode("utf-8"):
                problems.append(f"{path.relative_to(root)}: {name} (differs from {results.relative_to(root)}; "
                                f"run make docs-results or copy the file into the block)")
    return problems


def check_results_name(name: str, key: str = "RESULTS") -> str:
    check_file_name(key, name, "a results name (docs/results/<name>.md)")
    if _MARKER_LIKE.match(f"<!-- {name}"):
        raise ConfigError(f"{key} = {name!r} is not allowed: the file's first line, '<!-- {name}: written by ...', "
                          f"would start like a block marker; choose another name")
    return name


def write_results(sweep_dir: Path, name: str, root: Path = REPO) -> tuple[Path, list[Path]]:
    """Write ``docs/results/<name>.md`` from the sweep and every ``name`` block of the docs with it; (the file, the
    docs changed). Every doc's blocks are checked first: nothing is written when one is not well formed."""
    check_results_name(name)
    return publish(name, lambda: results_text(load_sweep(sweep_dir, histograms=False), name, sweep_dir), root)


def publish(name: str, make_text: Callable[[], str], root: Path = REPO) -> tuple[Path, list[Path]]:
    """Write ``docs/results/<name>.md`` with ``make_text()`` and every ``name`` block of the docs with it (any
    command's results go through here); the docs' blocks are checked before ``make_text`` runs."""
    docs = {path: _doc(path, root) for path in doc_files(root)}
    text = make_text()
    block_spans(text, f"the text for {name}")  # a block's body never holds a marker
    path = root / "docs" / "results" / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"))
    changed = []
    for doc, (original, spans) in docs.items():
        updated = original
        for block, start, end in reversed(spans):
            if block == name:
                updated = updated[:start] + text + updated[end:]
        if updated != original:
            atomic_write_bytes(doc, updated.encode("utf-8"))
            changed.append(doc)
    return path, changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", nargs="?", type=Path, help="the sweep folder (runs/<sweep>)")
    parser.add_argument("--name", help="the results file's name: docs/results/<name>.md")
    parser.add_argument("--check", action="store_true", help="only check the docs' blocks against their files")
    options = parser.parse_args(argv)
    if options.check:
        problems = stale_blocks()
        for problem in problems:
            print(f"stale: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if options.sweep_dir is None or not options.name:
        parser.error("give a sweep folder and --name (or --check)")
    try:
        path, changed = write_results(options.sweep_dir, options.name)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"results: {path}" + (f"; docs updated: {', '.join(str(p.relative_to(REPO)) for p in changed)}"
                                if changed else "; no docs block names it yet"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
