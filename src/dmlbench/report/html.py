"""A table's Markdown as a standalone HTML page, for ``snakemake --report``.

Snakemake's HTML report shows images, HTML and PDF inline and offers any other file (CSV, Markdown,
LaTeX) only as a download, so each table also gets an ``.html`` rendering of its ``.md``.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from markdown_it import MarkdownIt

from dmlbench.atomic import write_text_atomic

STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1.5em; color: #111; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.3em 0.7em; border-bottom: 1px solid #ccc; text-align: left; vertical-align: top; }
th { border-bottom: 2px solid #333; }
p { max-width: 60em; color: #333; }
"""


def html_page(markdown: str, title: str) -> str:
    """``markdown`` (pipe tables, bold, headings; raw HTML is escaped) as a complete HTML page.

    >>> "<td><strong>1.0</strong></td>" in html_page("| a |\\n|---|\\n| **1.0** |", "t")
    True
    """
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


def write_html_page(path: str | Path, markdown: str, title: str) -> Path:
    """Write :func:`html_page` of ``markdown`` to ``path`` atomically; returns the path."""
    return write_text_atomic(path, html_page(markdown, title))
