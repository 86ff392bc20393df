"""LaTeX comparison tables (booktabs) from per-run results.

Formatting decisions:

- cells are mean ± sample standard deviation (``ddof=1``) over seeds, evaluation
  metrics in percent with one decimal (``61.3 $\\pm$ 0.4``), other numbers (parameters,
  FLOPs, self-pair similarity, ...) as :func:`~.metric_format.metric_format` says; with
  one seed, just the mean;
- the best mean of each evaluation-metric column (R@K, NMI, MAP@R, RP, all
  higher-is-better) is bold; "best" compares the *displayed* (rounded) means, so cells
  that read the same are bold together; other columns are never bold;
- a (method, dataset) without runs, or a metric a run did not report, is ``--``;
- a cell whose (method, dataset) failed a mechanism-health check in any seed
  (:mod:`.health`) carries :data:`DEAD_MARK`; the caption says which check failed;
- reference rows (numbers printed in the papers, see :mod:`.paper_numbers`) follow
  under a ``\\midrule``, one row per (method, paper), only for datasets of the
  table; they are never bold and never part of the bold computation;
- tables with more than :data:`WIDE_COLUMNS` value columns use ``table*``; every
  tabular is shrunk to the line width only when wider than it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dmlbench.atomic import write_text_atomic
from .collect import aggregate_over_seeds
from .metric_format import MetricFormat, metric_format
from .spec import TableSpec

WIDE_COLUMNS = 8
MISSING = "--"
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


def format_cell(mean: float, std: float | None, display: MetricFormat = metric_format("R@1")) -> str:
    """``mean ± std`` as ``display`` says (default: fractions in, percent out, one decimal);
    just the mean when std is None/NaN."""
    text = display.text(mean)
    if std is None or pd.isna(std):
        return text
    return f"{text} $\\pm$ {display.text(std)}"


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


def _result_cells(results: pd.DataFrame, spec: TableSpec, dead: Collection[tuple[str, str]] = ()) -> list[list[str]]:
    """Formatted cells per method (rows) and (dataset, metric) (columns), bold on the best,
    :data:`DEAD_MARK` on the (dataset, method) pairs in ``dead``."""
    summary = aggregate_over_seeds(results).set_index(["dataset", "method", "metric"])
    columns = [(dataset, metric) for dataset in spec.datasets for metric in spec.metrics[dataset]]
    grid: list[list[str]] = []
    shown: list[list[float | None]] = []  # the displayed (rounded) mean, for the bold choice
    for method in spec.methods:
        cells: list[str] = []
        means: list[float | None] = []
        for dataset, metric in columns:
            key = (dataset, method, metric)
            display = metric_format(metric)
            if key in summary.index:
                mean, std = summary.loc[key, "mean"], summary.loc[key, "std"]
                cells.append(format_cell(mean, std, display))
                means.append(float(display.text(mean)) if display.bold_best else None)
            else:
                cells.append(MISSING)
                means.append(None)
        grid.append(cells)
        shown.append(means)
    for j in range(len(columns)):
        present = [value for value in (means[j] for means in shown) if value is not None]
        if not present:
            continue
        best = max(present)
        for cells, means in zip(grid, shown, strict=True):
            if means[j] == best:
                cells[j] = f"\\textbf{{{cells[j]}}}"
    for method, cells in zip(spec.methods, grid, strict=True):
        for j, (dataset, _) in enumerate(columns):
            if (dataset, method) in dead and cells[j] != MISSING:
                cells[j] += DEAD_MARK
    return grid


def render_comparison_table(
    results: pd.DataFrame,
    spec: TableSpec,
    caption: str,
    label: str,
    references: pd.DataFrame | None = None,
    dead: Collection[tuple[str, str]] = (),
) -> str:
    """Render the comparison table as LaTeX (needs ``booktabs`` and ``graphicx``).

    Args:
        results: long results from :func:`~dmlbench.report.collect.collect_runs`
            (values as fractions); keys not in ``spec.metrics`` are ignored.
        spec: datasets (column groups), methods (rows), metrics and labels.
        caption: LaTeX caption text, inserted verbatim (see
            :func:`~dmlbench.report.caption.caption_text`); when reference rows are shown a
            sentence explaining them is appended.
        label: the ``\\label`` key (escaping is not applied; use e.g. ``tab:main``).
        references: paper numbers from
            :func:`~dmlbench.report.paper_numbers.load_paper_numbers`; None for no reference rows.
        dead: (dataset, method) pairs whose mechanism did not engage (:func:`.health.dead_cells`);
            their cells get :data:`DEAD_MARK` (the caption must explain it, :func:`.health.dead_caption`).

    Returns:
        The LaTeX source of one ``table``/``table*`` environment, ending in a newline.
    """
    columns = [(dataset, metric) for dataset in spec.datasets for metric in spec.metrics[dataset]]
    grid = _result_cells(results, spec, dead)
    reference_rows = [] if references is None else _reference_rows(references, spec)
    if reference_rows:
        caption = (
            f"{caption} Lower block: numbers printed in the cited papers (with their own backbone, "
            "embedding size d, image size and checkpoint selection); never bold, not compared."
        )
    environment = "table*" if len(columns) > WIDE_COLUMNS else "table"

    group_header = ["Method"]
    rules = []
    first = 2
    for dataset in spec.datasets:
        width = len(spec.metrics[dataset])
        group_header.append(f"\\multicolumn{{{width}}}{{c}}{{{escape_latex(spec.dataset_label(dataset))}}}")
        rules.append(f"\\cmidrule(lr){{{first}-{first + width - 1}}}")
        first += width
    metric_header = [""] + [escape_latex(metric_format(metric).header) for _, metric in columns]

    def line(cells: Sequence[str]) -> str:
        return " & ".join(cells) + " \\\\"

    body = [line([escape_latex(spec.method_label(m)), *row]) for m, row in zip(spec.methods, grid, strict=True)]
    lines = [
        f"\\begin{{{environment}}}[tbp]",
        "\\centering",
        f"\\caption{{{caption}}}",
        f"\\label{{{label}}}",
        "\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%",
        f"\\begin{{tabular}}{{l{'c' * len(columns)}}}",
        "\\toprule",
        line(group_header),
        " ".join(rules),
        line(metric_header),
        "\\midrule",
        *body,
    ]
    if reference_rows:
        lines += ["\\midrule", *(line([row.label, *row.cells]) for row in reference_rows)]
    lines += ["\\bottomrule", "\\end{tabular}%", "}", f"\\end{{{environment}}}"]
    return "\n".join(lines) + "\n"


def write_table(path: str | Path, text: str) -> Path:
    """Write a rendered table atomically (temporary file + ``os.replace``); returns the path."""
    return write_text_atomic(path, text)
