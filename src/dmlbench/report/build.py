"""The report step: one comparison table (.tex, .csv, .md, .html) and its two plots (.png) from run directories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dmlbench.atomic import atomic_outputs, write_text_atomic
from dmlbench.methods.health import HealthCheck

from .caption import Varying, caption_text
from .collect import RunDir, collect_runs, load_logs
from .health import dead_caption, dead_cells
from .html import write_html_page
from .latex import latex_from_plain, plain_from_latex, render_comparison_table, write_table
from .metric_format import metric_definitions
from .paper_numbers import load_paper_numbers
from .plots import plot_recall_at_k, plot_training_curves
from .spec import TABLE_SUFFIXES, TableSpec
from .summary import render_markdown, summarise, write_cells_csv


#: Under the plots in a table's HTML page.
RECALL_CAPTION = (
    "Recall@K against K, per dataset: the table's means and ± the half-widths of its 95 % intervals "
    "(reference rows dashed and grey)."
)
CURVES_CAPTION = (
    "Training loss (divided by its first-epoch value) and validation R@1 per epoch of the trained "
    "methods: mean over the seeds, band: the 95 % interval over the seeds."
)


@dataclass(frozen=True)
class Report:
    """What :func:`build_report` wrote.

    Attributes:
        cells: the table's cells (:func:`~.summary.summarise`; the CSV's content).
        dead: the failed mechanism-health checks per (dataset, method) (empty when every mechanism engaged).
    """

    cells: pd.DataFrame
    dead: dict[tuple[str, str], list[str]]


def _check_runs(runs: Sequence[RunDir], spec: TableSpec, seeds: Any) -> None:
    """Runs must belong to the table, and (when the seeds are one list) every cell has exactly those seeds."""
    outside = sorted(
        {(r.dataset, r.method) for r in runs if r.dataset not in spec.datasets or r.method not in spec.methods}
    )
    if outside:
        raise ValueError(
            f"runs for {outside} are not part of the table (datasets {spec.datasets}, methods {spec.methods})"
        )
    if isinstance(seeds, Varying):
        return
    expected = sorted(int(seed) for seed in seeds)
    found: dict[tuple[str, str], list[int]] = {}
    for run in runs:
        found.setdefault((run.dataset, run.method), []).append(run.seed)
    wrong = {cell: sorted(got) for cell, got in found.items() if sorted(got) != expected}
    if wrong:
        raise ValueError(f"the caption states seeds {expected}, but these cells have other seeds: {wrong}")


def build_report(
    runs: Sequence[RunDir],
    spec: TableSpec,
    settings: Mapping[str, Any],
    *,
    table_path: str | Path,
    curves_png: str | Path,
    recall_png: str | Path,
    label: str,
    references: bool = True,
    log_runs: Sequence[RunDir] | None = None,
    health_checks: Mapping[tuple[str, str], Sequence[HealthCheck]] | None = None,
    note: str = "",
) -> Report:
    """Write the comparison table and both plots for one table spec (what ``dmlbench report`` calls).

    The table goes to ``table_path`` (LaTeX, with the reference rows), and beside it to the same name
    with ``.csv`` (:data:`~.summary.CELL_COLUMNS`), ``.md`` (Markdown and the caption as plain text) and
    ``.html`` (that Markdown as a page followed by both plots, for ``snakemake --report``). All six files
    are written in full first and renamed into place together at the end (:func:`dmlbench.atomic.atomic_outputs`):
    a report that fails or is killed part-way leaves every old file, never a new ``.tex`` beside an old ``.md``.

    Args:
        runs: the run directories of the table (e.g. ``RunDir.from_path`` of each
            ``results/runs/<dataset>/<method>/seed<k>``); a (method, dataset) without runs
            shows ``--``.
        spec: datasets, methods, metrics and display labels.
        settings: caption settings (see :func:`~dmlbench.report.caption.caption_text`; use
            :func:`~dmlbench.report.caption.merge_settings` when runs differ).
        table_path: the ``.tex`` output (one ``table``/``table*`` environment); the ``.csv``, ``.md`` and
            ``.html`` go beside it.
        curves_png: training loss and validation R@1 per epoch.
        recall_png: Recall@K against K (the table's means and confidence intervals).
        label: LaTeX ``\\label`` of the table.
        references: add the primary paper numbers of the table's methods and datasets.
        log_runs: the runs whose ``log.csv`` the training-curves plot reads (default: all;
            ensembles and methods that re-embed another checkpoint have none).
        health_checks: mechanism-health checks per (dataset, method) (the recipes'
            :meth:`~dmlbench.methods.base.Recipe.health_checks`); failing cells are marked.
        note: plain text added to the caption after the settings (the table's ``caption``, e.g. a tuned
            table's budget, folds and spaces).

    Returns:
        The cells and the failed health checks.

    Raises:
        ValueError: runs outside the spec, seeds that contradict the caption, bad settings.
        ReportInputError: a missing or malformed metrics.json / per_query.npz / log.csv (named).
        SameFileError: two of the outputs are one file (e.g. a plot path equal to the table's).
    """
    runs = list(runs)
    _check_runs(runs, spec, settings["seeds"])
    results = collect_runs(runs)
    dead = dead_cells(results, health_checks or {})
    cells = summarise(results, runs, spec, dead)
    shown = [metric for dataset in spec.datasets for metric in spec.metrics[dataset]]
    caption = " ".join(
        filter(
            None,
            [
                caption_text(settings),
                latex_from_plain(note),
                latex_from_plain(metric_definitions(shown)),
                dead_caption(dead, spec),
            ],
        )
    )
    logs = load_logs(runs if log_runs is None else log_runs)
    paper_numbers = load_paper_numbers() if references else None
    table_path = Path(table_path)
    outputs = {suffix: table_path.with_suffix(suffix) for suffix in TABLE_SUFFIXES}
    with atomic_outputs({**outputs, "training-curves plot": curves_png, "Recall@K plot": recall_png}) as tmp:
        write_table(tmp[".tex"], render_comparison_table(cells, spec, caption, label, references=paper_numbers))
        write_cells_csv(tmp[".csv"], cells)
        markdown = render_markdown(cells, plain_from_latex(caption))
        write_text_atomic(tmp[".md"], markdown)
        plot_training_curves(logs, tmp["training-curves plot"], spec)
        plot_recall_at_k(cells, spec, tmp["Recall@K plot"])
        figures = [
            (RECALL_CAPTION, Path(tmp["Recall@K plot"]).read_bytes()),
            (CURVES_CAPTION, Path(tmp["training-curves plot"]).read_bytes()),
        ]
        write_html_page(tmp[".html"], markdown, title=table_path.stem, figures=figures)
    return Report(cells, dead)
