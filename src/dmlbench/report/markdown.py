"""Markdown pipe tables: the one writer of the comparison tables' and the claims table's ``.md``."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_row(cells: Sequence[str]) -> str:
    """One pipe-table row; a ``|`` inside a cell is escaped.

    >>> markdown_row(["a", "b | c"])
    '| a | b \\\\| c |'
    """
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str = "") -> str:
    """A pipe table (plain-text cells; ``**bold**`` and the like pass through), then ``caption`` (plain text)
    after a blank line; ends in a newline.

    >>> print(markdown_table(["Method", "R@1"], [["a", "61.3 ± 0.4"]], "Cells: mean ± half-width."))
    | Method | R@1 |
    |---|---|
    | a | 61.3 ± 0.4 |
    <BLANKLINE>
    Cells: mean ± half-width.
    <BLANKLINE>
    """
    return "\n".join([markdown_row(header), "|" + "---|" * len(header), *map(markdown_row, rows), "", caption, ""])
