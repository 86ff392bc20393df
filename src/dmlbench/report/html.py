"""A table's Markdown as a standalone HTML page, for ``snakemake --report``.

Snakemake's HTML report shows images, HTML and PDF inline and offers any other file (CSV, Markdown,
LaTeX) only as a download, so each table also gets an ``.html`` rendering of its ``.md``, followed by its
plots (PNG data URIs: the page is one self-contained file). The report's first page embeds the main table's
page in itself (``workflow/report/workflow.rst``), so the page's content sits in one element of class
:data:`CONTAINER` and its style applies inside that element only: embedded, it leaves the rest of the report
as it is.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape
from pathlib import Path

from markdown_it import MarkdownIt

from dmlbench.atomic import write_text_atomic

#: The class of the element that holds a page's content; its style applies inside it only.
CONTAINER = "dmlbench-table"
STYLE = f"""
body > .{CONTAINER} {{ margin: 1.5em; }}
.{CONTAINER} {{ font-family: system-ui, sans-serif; font-size: 14px; color: #111; overflow-x: auto; }}
.{CONTAINER} table {{ border-collapse: collapse; margin: 1em 0; font-size: 14px; width: auto; }}
.{CONTAINER} th, .{CONTAINER} td {{ padding: 0.3em 0.7em; border-bottom: 1px solid #ccc; text-align: left;
    vertical-align: top; white-space: nowrap; }}
.{CONTAINER} td:first-child {{ white-space: normal; min-width: 12em; }}
.{CONTAINER} th {{ border-bottom: 2px solid #333; }}
.{CONTAINER} p {{ max-width: 60em; color: #333; }}
.{CONTAINER} figure {{ margin: 1em 0; }}
.{CONTAINER} img {{ max-width: 100%; height: auto; }}
.{CONTAINER} figcaption {{ max-width: 60em; color: #333; font-size: 13px; }}
"""


def html_page(markdown: str, title: str, figures: Sequence[tuple[str, bytes]] = ()) -> str:
    """``markdown`` (pipe tables, bold, headings; raw HTML is escaped) as a complete HTML page, followed by
    ``figures``: (caption, PNG bytes) each, embedded as data URIs.

    >>> "<td><strong>1.0</strong></td>" in html_page("| a |\\n|---|\\n| **1.0** |", "t")
    True
    >>> '<img alt="x &amp; y" src="data:image/png;base64,iVBORw==">' in html_page("", "t", [("x & y", b"\\x89PNG")])
    True
    """
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    for caption, png in figures:
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        body += (
            f'<figure>\n<img alt="{escape(caption)}" src="{uri}">\n'
            f"<figcaption>{escape(caption)}</figcaption>\n</figure>\n"
        )
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{escape(title)}</title>\n'
        f'<style>{STYLE}</style>\n</head>\n<body>\n<main class="{CONTAINER}">\n{body}</main>\n</body>\n</html>\n'
    )


def write_html_page(path: str | Path, markdown: str, title: str, figures: Sequence[tuple[str, bytes]] = ()) -> Path:
    """Write :func:`html_page` of ``markdown`` and ``figures`` to ``path`` atomically; returns the path."""
    return write_text_atomic(path, html_page(markdown, title, figures))
