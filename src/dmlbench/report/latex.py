"""LaTeX comparison tables (booktabs) from the cells of :func:`~.summary.summarise`.

Formatting decisions:

- cells are mean ± half-width of the 95 % bootstrap confidence interval (:mod:`.significance`),
  evaluation metrics in percent with one decimal (``61.3 $\\pm$ 0.4``), other numbers (parameters,
  FLOPs, self-pair similarity, ...) as :func:`~.metric_format.metric_format` says; a cell without an
  interval (a per-run number of a single seed) shows just the mean;
- in each evaluation-metric column (R@K, NMI, MAP@R, RP, all higher-is-better) the best mean and
  every row that is not significantly worse than it (one-sided paired bootstrap test, α = 0.05)
  are bold; other columns are never bold;
- a (method, dataset) without runs, or a metric a run did not report, is ``--``;
- a cell whose (method, dataset) failed a mechanism-health check in any seed
  (:mod:`.health`) carries :data:`DEAD_MARK`; the caption says which check failed;
- reference rows (numbers printed in the papers, see :mod:`.paper_numbers`) follow
  under a ``\\midrule``, one row per (method, paper), only for datasets of the
  table; they are never bold and never part of the bold computation;
- a table of several datasets with more than :data:`BLOCK_COLUMNS` value columns (the paper overlay's
  table1: four datasets of up to nine metrics) is set as blocks of whole datasets stacked in one float, each
  with its own header rows and every method row, so that its cells keep a readable size;
- tables (or blocks) with more than :data:`WIDE_COLUMNS` value columns use ``table*``; every
  tabular is shrunk to the line width only when wider than it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dmlbench.atomic import write_text_atomic

from .metric_format import metric_format
from .spec import TableSpec
from .summary import MISSING, Layout, styled_text

WIDE_COLUMNS = 8
#: Most value columns of one block of a table of several datasets (a dataset with more is a block of its own).
BLOCK_COLUMNS = 12
#: Appended to the cells of a (method, dataset) whose mechanism did not engage (:mod:`.health`).
DEAD_MARK = "\\textsuperscript{\\dag}"

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
}
_LATEX_SPECIAL_RE = re.compile("|".join(re.escape(char) for char in _LATEX_SPECIAL))


def escape_latex(text: str) -> str:
    """Escape LaTeX special characters so that ``text`` prints literally.

    >>> escape_latex("a_b & 5% #1")
    'a\\\\_b \\\\& 5\\\\% \\\\#1'
    """
    return _LATEX_SPECIAL_RE.sub(lambda match: _LATEX_SPECIAL[match.group()], text)


#: Plain-text characters that captions, notes and the claims' cells use → their LaTeX.
_PLAIN_TO_LATEX = {
    "±": "$\\pm$",
    "α": "$\\alpha$",
    "†": "$\\dag$",
    "—": "---",
    "−": "$-$",
    "≈": "$\\approx$",
    "≤": "$\\leq$",
    "≥": "$\\geq$",
    "×": "$\\times$",
}


def latex_from_plain(text: str) -> str:
    """Plain text (with ±, α, †, —, −, ≈, ≤, ≥, ×) as LaTeX: special characters escaped, those symbols typeset.

    >>> latex_from_plain("61.0 ± 1.4 (α = 5 %)")
    '61.0 $\\\\pm$ 1.4 ($\\\\alpha$ = 5 \\\\%)'
    """
    text = escape_latex(text)
    for plain, latex in _PLAIN_TO_LATEX.items():
        text = text.replace(plain, latex)
    return text


def plain_from_latex(text: str) -> str:
    """A caption written for LaTeX as plain text: the inverse of :func:`escape_latex` and
    :func:`latex_from_plain`, and ``\\textbf{x}`` → ``x``.

    >>> plain_from_latex(r"\\textbf{Mixed} 5\\% $\\pm$ 1, a\\_b --- c")
    'Mixed 5% ± 1, a_b — c'
    """
    for plain, latex in _PLAIN_TO_LATEX.items():
        text = text.replace(latex, plain)
    text = re.sub(r"\\textbf\{([^{}]*)\}", r"\1", text)
    inverse = {latex: char for char, latex in _LATEX_SPECIAL.items()}
    return re.sub("|".join(re.escape(latex) for latex in inverse), lambda m: inverse[m.group()], text)


@dataclass(frozen=True)
class _ReferenceRow:
    label: str
    cells: list[str]


def _reference_rows(references: pd.DataFrame, spec: TableSpec) -> list[_ReferenceRow]:
    """Primary paper entries for the table's methods and datasets, one row per (method, paper)."""
    columns = [(dataset, metric) for dataset in spec.datasets for metric in spec.metrics[dataset]]
    shown = references[
        references["primary"]
        & references["dataset"].isin(spec.datasets)
        & references["method"].isin(spec.methods)
        & references["metric"].isin({metric for _, metric in columns})
    ]
    rows = []
    for method in spec.methods:
        for_method = shown[shown["method"] == method]
        for paper in sorted(for_method["paper"].unique()):
            entries = for_method[for_method["paper"] == paper]
            values = {(r.dataset, r.metric): r.value for r in entries.itertuples()}
            cells = [f"{values[c]:.1f}" if c in values else MISSING for c in columns]
            if all(cell == MISSING for cell in cells):
                continue
            tables = sorted({int(t.split()[1]) for t in entries["table"]})
            setup = [
                *sorted({b for b in entries["backbone"] if isinstance(b, str)}),
                *(f"d={int(d)}" for d in sorted(set(entries["embedding_dim"].dropna()))),
            ]
            citation = f"{entries['citation'].iloc[0]} Tab. {', '.join(map(str, tables))}"
            note = f"; {', '.join(setup)}" if setup else ""
            label = f"{escape_latex(spec.method_label(method))} (paper: {escape_latex(citation + note)})"
            rows.append(_ReferenceRow(label=label, cells=cells))
    return rows


def _result_cells(cells: pd.DataFrame, spec: TableSpec) -> list[list[str]]:
    """LaTeX cells per method (rows) and (dataset, metric) (columns): bold where the cells frame says,
    :data:`DEAD_MARK` on dead (dataset, method) pairs."""
    layout = Layout.of(cells)
    return [
        [styled_text(cell, ("\\textbf{", "}"), DEAD_MARK, "$\\pm$") for cell in layout.row(method)]
        for method in spec.methods
    ]


def dataset_blocks(spec: TableSpec, limit: int = BLOCK_COLUMNS) -> list[list[str]]:
    """The table's datasets in order, grouped into blocks of at most ``limit`` value columns (a dataset with
    more is a block of its own).

    >>> spec = TableSpec(["a", "b", "c"], ["m"], {"a": ["R@1"], "b": ["R@1", "NMI"], "c": ["NMI"]})
    >>> dataset_blocks(spec, 2), dataset_blocks(spec, 3)
    ([['a'], ['b'], ['c']], [['a', 'b'], ['c']])
    """
    blocks: list[list[str]] = []
    width = 0
    for dataset in spec.datasets:
        columns = len(spec.metrics[dataset])
        if blocks and width + columns <= limit:
            blocks[-1].append(dataset)
            width += columns
        else:
            blocks.append([dataset])
            width = columns
    return blocks


def latex_row(cells: Sequence[str]) -> str:
    """One tabular row of LaTeX cells.

    >>> print(latex_row(["a", "61.3"]))
    a & 61.3 \\\\
    """
    return " & ".join(cells) + " \\\\"


def booktabs_tabular(columns: str, header: Sequence[str], body: Sequence[str], lower: Sequence[str] = ()) -> list[str]:
    """The lines of one booktabs tabular, shrunk to the line width only when wider than it (needs ``graphicx``).

    Args:
        columns: the column specification (``lcc``, ``lp{4cm}c``).
        header: the header lines between ``\\toprule`` and ``\\midrule`` (rows of :func:`latex_row`, rules).
        body: the rows.
        lower: rows of a lower block under a second ``\\midrule`` (the papers' numbers); none: no block.
    """
    return [
        "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%",
        f"\\begin{{tabular}}{{{columns}}}",
        "\\toprule",
        *header,
        "\\midrule",
        *body,
        *(["\\midrule", *lower] if lower else []),
        "\\bottomrule",
        "\\end{tabular}%",
        "}",
    ]


def table_float(environment: str, caption: str, label: str, tabulars: Sequence[Sequence[str]]) -> str:
    """One float (``table`` or ``table*``) of the tabulars of :func:`booktabs_tabular`, stacked with a skip.

    Args:
        environment: ``table`` or ``table*`` (a float over both columns).
        caption: LaTeX, inserted verbatim.
        label: the ``\\label`` key (not escaped; e.g. ``tab:main``).
        tabulars: the lines of each tabular.

    Returns:
        The LaTeX source, ending in a newline.
    """
    lines = [f"\\begin{{{environment}}}[tbp]", "\\centering", f"\\caption{{{caption}}}", f"\\label{{{label}}}"]
    for number, tabular in enumerate(tabulars):
        lines += [*(["\\par\\medskip"] if number else []), *tabular]
    return "\n".join([*lines, f"\\end{{{environment}}}"]) + "\n"


def render_comparison_table(
    cells: pd.DataFrame,
    spec: TableSpec,
    caption: str,
    label: str,
    references: pd.DataFrame | None = None,
) -> str:
    """Render the comparison table as LaTeX (needs ``booktabs`` and ``graphicx``).

    Args:
        cells: the cells of :func:`~dmlbench.report.summary.summarise` for ``spec`` (values as
            fractions; bold and dead flags decided there).
        spec: datasets (column groups), methods (rows), metrics and labels.
        caption: LaTeX caption text, inserted verbatim (see
            :func:`~dmlbench.report.caption.caption_text`; it must explain the daggers,
            :func:`.health.dead_caption`); when reference rows are shown a sentence explaining
            them is appended.
        label: the ``\\label`` key (escaping is not applied; use e.g. ``tab:main``).
        references: paper numbers from
            :func:`~dmlbench.report.paper_numbers.load_paper_numbers`; None for no reference rows.

    Returns:
        The LaTeX source of one ``table``/``table*`` environment, ending in a newline: one tabular, or one per
        block of datasets (:func:`dataset_blocks`) when several datasets have more than :data:`BLOCK_COLUMNS`
        value columns together.
    """
    columns = [(dataset, metric) for dataset in spec.datasets for metric in spec.metrics[dataset]]
    grid = _result_cells(cells, spec)
    reference_rows = [] if references is None else _reference_rows(references, spec)
    blocks = dataset_blocks(spec)
    if reference_rows:
        unreported = [m for m in ("MAP@R", "RP") if any(metric == m for _, metric in columns)]
        caption = (
            f"{caption} Lower block{' of each part' if len(blocks) > 1 else ''}: numbers printed in the cited "
            "papers (with their own backbone, embedding size d, image size and checkpoint selection; -- where the "
            f"paper prints none{', as for ' + ' and '.join(unreported) if unreported else ''}); never bold, not "
            "compared."
        )
    widest = max(sum(len(spec.metrics[d]) for d in block) for block in blocks)
    tabulars = []
    for block in blocks:
        shown = [i for i, (dataset, _) in enumerate(columns) if dataset in block]
        group_header = ["Method"]
        rules = []
        first = 2
        for dataset in block:
            width = len(spec.metrics[dataset])
            group_header.append(f"\\multicolumn{{{width}}}{{c}}{{{escape_latex(spec.dataset_label(dataset))}}}")
            rules.append(f"\\cmidrule(lr){{{first}-{first + width - 1}}}")
            first += width
        metric_header = [""] + [escape_latex(metric_format(columns[i][1]).header) for i in shown]
        body = [
            latex_row([escape_latex(spec.method_label(m)), *(row[i] for i in shown)])
            for m, row in zip(spec.methods, grid, strict=True)
        ]
        references_shown = [[row.label, *(row.cells[i] for i in shown)] for row in reference_rows]
        references_shown = [row for row in references_shown if any(cell != MISSING for cell in row[1:])]
        tabulars.append(
            booktabs_tabular(
                f"l{'c' * len(shown)}",
                [latex_row(group_header), " ".join(rules), latex_row(metric_header)],
                body,
                [latex_row(row) for row in references_shown],
            )
        )
    return table_float("table*" if widest > WIDE_COLUMNS else "table", caption, label, tabulars)


def write_table(path: str | Path, text: str) -> Path:
    """Write a rendered table atomically (temporary file + ``os.replace``); returns the path."""
    return write_text_atomic(path, text)
