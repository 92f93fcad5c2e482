"""``report.md`` -> ``report.html``: the same report as one page, numbers unwrapped and right-aligned."""

from __future__ import annotations

import html
import os
from pathlib import Path

from markdown_it import MarkdownIt

PAGE_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1.5em; color: #1a1a1a; line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 14px; display: block; overflow-x: auto; }
/* !important: the Markdown renderer writes each column's alignment inline; numbers read best right-aligned */
th { border-bottom: 2px solid #333; padding: 4px 10px; vertical-align: bottom; text-align: right !important; }
td { padding: 3px 10px; white-space: nowrap; font-variant-numeric: tabular-nums; border-bottom: 1px solid #e2e2e2;
     text-align: right !important; }
tr:last-child td { border-bottom: 2px solid #333; }
img { max-width: min(100%, 760px); height: auto; display: block; }
code { background: #f3f3f3; padding: 0 3px; border-radius: 3px; }
"""


def render_report_html(markdown_text: str, title: str) -> str:
    # commonmark plus tables and strikethrough (gfm-like would also need linkify-it-py)
    body = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"]).render(markdown_text)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{PAGE_STYLE}</style>\n</head>\n<body>\n{body}</body>\n"
            "</html>\n")


def write_report_html(report_md: str | os.PathLike[str]) -> Path:
    """Write ``report.html`` beside ``report.md``; return its path."""
    report_md = Path(report_md)
    text = report_md.read_text(encoding="utf-8")
    first = text.splitlines()[0].lstrip("# ") if text else "Sweep report"
    path = report_md.with_suffix(".html")
    path.write_text(render_report_html(text, first), encoding="utf-8")
    return path
