"""The cells of a comparison table with confidence intervals and the bold rule; CSV, Markdown and text.

:func:`summarise` turns the runs of a table into one row per (dataset, method, metric) cell
(:data:`CELL_COLUMNS`): the mean over seeds (of the mean over test queries), the bounds of its 95 %
bootstrap interval, the p-value of "worse than the column's best" and whether the cell is bold
(:mod:`.significance` says how and why). That frame is what ``results/tables/<name>.csv`` holds
(values as stored in metrics.json: fractions for evaluation metrics); the LaTeX table
(:mod:`.latex`), the Markdown file and the console text are rendered from it, so ``dmlbench
summary`` can print a table from its CSV alone.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.atomic import write_text_atomic
from dmlbench.evaluation.per_query import DECOMPOSABLE
from dmlbench.layout import METRICS_FILE, PER_QUERY_FILE

from .collect import ReportInputError, RunDir, per_query_values, read_per_query
from .markdown import markdown_table
from .metric_format import metric_format
from .significance import ALPHA, BOOTSTRAP_SAMPLES, bootstrap_means, method_text, percentile_interval, worse_p_value
from .spec import TableSpec

#: Columns of the cells frame / CSV. ``mean``, ``ci_low``, ``ci_high`` as stored in metrics.json (fractions
#: for evaluation metrics); ``queries``: test queries resampled per seed (0: a per-run number, seeds only);
#: ``p_worse``: paired bootstrap p-value against the column's best row (empty for the best and for columns
#: without a best); empty ``mean``: no runs or the metric not reported (shown ``--``).
CELL_COLUMNS = [
    "dataset",
    "dataset_label",
    "method",
    "method_label",
    "metric",
    "mean",
    "ci_low",
    "ci_high",
    "seeds",
    "queries",
    "p_worse",
    "bold",
    "dead",
]
MISSING = "--"
#: After a plain-text (Markdown, console) cell whose mechanism did not engage; LaTeX: :data:`.latex.DEAD_MARK`.
PLAIN_DEAD_MARK = " †"
#: Tolerance between a metrics.json value and the mean of its per-query values.
AGREEMENT_TOLERANCE = 1e-9


@dataclass(frozen=True)
class _Estimate:
    """One cell before the bold rule: replicates (B,), mean, interval, sizes, and the query rows (pairing)."""

    replicates: np.ndarray
    mean: float
    low: float
    high: float
    seeds: int
    queries: int
    rows: np.ndarray | None


def _decomposed_values(arrays: dict[str, np.ndarray], metric: str, path: Path) -> np.ndarray:
    """(Q,) :func:`per_query_values` of a metric that has them (the callers pass only such metrics)."""
    values = per_query_values(arrays, metric, path)
    if values is None:
        raise ValueError(f"{metric} has no per-query values: per_query_block takes decomposable metrics only")
    return values


def per_query_block(
    runs: Sequence[RunDir], metrics: Sequence[str], reported: pd.DataFrame
) -> tuple[np.ndarray, np.ndarray]:
    """(S, Q, M) per-query values of ``metrics`` in the runs (seed order) and the (Q,) query rows.

    Raises:
        ReportInputError: a missing or incomplete per_query.npz, seeds with other test queries, or a
            per-query mean that disagrees with metrics.json (files from different evaluations).
    """
    blocks, rows = [], None
    for run in runs:
        path = run.path / PER_QUERY_FILE
        arrays = read_per_query(path)
        if rows is None:
            rows = arrays["row"]
        elif not np.array_equal(arrays["row"], rows):
            raise ReportInputError(
                f"{path}: other test queries than {runs[0].path / PER_QUERY_FILE}; "
                "the seeds of one cell must be evaluated on the same test set"
            )
        block = np.stack([_decomposed_values(arrays, metric, path) for metric in metrics], axis=1)  # (Q, M)
        stored = reported.loc[run.seed, list(metrics)].to_numpy(dtype=float)
        off = np.flatnonzero(np.abs(block.mean(axis=0) - stored) > AGREEMENT_TOLERANCE)
        if len(off):
            metric = metrics[off[0]]
            raise ReportInputError(
                f"{path}: the per-query values give {metric} = {block[:, off[0]].mean():.6f} but "
                f"{run.path / METRICS_FILE} says {stored[off[0]]:.6f}: the two files come from different "
                f"evaluations; rerun `dmlbench evaluate` on {run.path / 'embeddings.npz'}"
            )
        blocks.append(block)
    if rows is None:
        raise ValueError("per_query_block needs at least one run")
    return np.stack(blocks), rows


def _estimates(
    values: np.ndarray, metrics: Sequence[str], rows: np.ndarray | None, samples: int
) -> dict[str, _Estimate]:
    """Bootstrap estimates of the M metrics of ``values`` (S, Q, M); ``rows``: the Q query rows (None: per-run)."""
    if not metrics:
        return {}
    replicates = bootstrap_means(values, samples)
    low, high = percentile_interval(replicates)
    num_seeds, num_queries, _ = values.shape
    no_interval = num_seeds == 1 and num_queries == 1
    return {
        metric: _Estimate(
            replicates[:, j],
            float(values[:, :, j].mean()),
            math.nan if no_interval else float(low[j]),
            math.nan if no_interval else float(high[j]),
            num_seeds,
            0 if rows is None else num_queries,
            rows,
        )
        for j, metric in enumerate(metrics)
    }


def _cell_estimates(
    results: pd.DataFrame, runs: Sequence[RunDir], metrics: Sequence[str], samples: int
) -> dict[str, _Estimate]:
    """Estimates of the metrics that every run of one (dataset, method) reports (runs in seed order)."""
    if not runs:
        return {}
    reported = results.pivot(index="seed", columns="metric", values="value").loc[[run.seed for run in runs]]
    shown = [m for m in metrics if m in reported.columns and reported[m].notna().all()]
    per_query = [m for m in shown if DECOMPOSABLE.match(m)]
    per_run = [m for m in shown if m not in per_query]
    estimates = _estimates(reported[per_run].to_numpy(dtype=float)[:, None, :], per_run, None, samples)
    if per_query:
        values, rows = per_query_block(runs, per_query, reported)
        estimates.update(_estimates(values, per_query, rows, samples))
    return estimates


def _p_values(column: Mapping[str, _Estimate], bold_best: bool, where: str) -> dict[str, float]:
    """p-value of each method against the column's best (NaN for the best); empty when nothing is bold."""
    if not column or not bold_best:
        return {}
    best = max(column, key=lambda method: column[method].mean)
    p_values = {best: math.nan}
    for method, estimate in column.items():
        if method == best:
            continue
        reference = column[best]
        if (
            estimate.seeds != reference.seeds
            or (estimate.rows is None) != (reference.rows is None)
            or (
                estimate.rows is not None
                and reference.rows is not None
                and not np.array_equal(estimate.rows, reference.rows)
            )
        ):
            raise ReportInputError(
                f"{where}: cannot pair {method} with the best row {best}: other seeds or test "
                f"queries ({estimate.seeds} vs {reference.seeds} seeds)"
            )
        p_values[method] = worse_p_value(reference.replicates, estimate.replicates)
    return p_values


def summarise(
    results: pd.DataFrame,
    runs: Sequence[RunDir],
    spec: TableSpec,
    dead: Collection[tuple[str, str]] = (),
    samples: int = BOOTSTRAP_SAMPLES,
) -> pd.DataFrame:
    """The table's cells with bootstrap intervals and the bold rule (:mod:`.significance`).

    A cell is bold when its column is a higher-is-better evaluation metric and it is the best mean or
    not significantly worse than it (paired p-value ≥ :data:`~.significance.ALPHA`).

    Args:
        results: long results of ``runs`` (:func:`~dmlbench.report.collect.collect_runs`).
        runs: the run directories; their ``per_query.npz`` is read for the R@K, MAP@R and RP columns.
        spec: datasets, methods, metrics and labels.
        dead: (dataset, method) pairs whose mechanism did not engage.
        samples: bootstrap replicates.

    Returns:
        :data:`CELL_COLUMNS`, one row per (dataset, metric, method) in table order (empty ``mean``: ``--``).

    Raises:
        ReportInputError: a missing per_query.npz (naming it and the fix), or files that disagree.
    """
    rows = []
    for dataset in spec.datasets:
        estimates = {}
        for method in spec.methods:
            cell_runs = sorted((r for r in runs if (r.dataset, r.method) == (dataset, method)), key=lambda r: r.seed)
            cell_results = results[(results["dataset"] == dataset) & (results["method"] == method)]
            estimates[method] = _cell_estimates(cell_results, cell_runs, spec.metrics[dataset], samples)
        for metric in spec.metrics[dataset]:
            column = {m: estimates[m][metric] for m in spec.methods if metric in estimates[m]}
            p_values = _p_values(column, metric_format(metric).bold_best, f"{metric} on {dataset}")
            for method in spec.methods:
                estimate = column.get(method)
                p_value = p_values.get(method, math.nan)
                rows.append(
                    [
                        dataset,
                        spec.dataset_label(dataset),
                        method,
                        spec.method_label(method),
                        metric,
                        *(
                            (estimate.mean, estimate.low, estimate.high, estimate.seeds, estimate.queries)
                            if estimate
                            else (math.nan, math.nan, math.nan, 0, 0)
                        ),
                        p_value,
                        method in p_values and not p_value < ALPHA,
                        (dataset, method) in dead,
                    ]
                )
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def cell_text(cell: pd.Series, plus_minus: str = "±") -> str:
    """``mean ± half-width`` of one cell as its metric is displayed (``--`` when missing; mean only without
    an interval)."""
    if pd.isna(cell["mean"]):
        return MISSING
    return metric_format(cell["metric"]).estimate(
        float(cell["mean"]), float(cell["ci_low"]), float(cell["ci_high"]), plus_minus
    )


@dataclass(frozen=True)
class Layout:
    """Rows and columns of a cells frame, in table order."""

    columns: list[tuple[str, str]]
    methods: list[str]
    cells: dict[tuple[str, str, str], pd.Series]
    labels: dict[str, str]

    @classmethod
    def of(cls, cells: pd.DataFrame) -> Layout:
        """Columns (dataset, metric) and method rows in order of first appearance."""
        records = {(row["dataset"], row["method"], row["metric"]): row for _, row in cells.iterrows()}
        return cls(
            columns=list(dict.fromkeys((d, m) for d, _, m in records)),
            methods=list(dict.fromkeys(m for _, m, _ in records)),
            cells=records,
            labels={
                **dict(zip(cells["dataset"], cells["dataset_label"])),
                **dict(zip(cells["method"], cells["method_label"])),
            },
        )

    def headers(self) -> list[str]:
        """Column headers: the metric's header, after the dataset's label when there are several datasets."""
        several = len({dataset for dataset, _ in self.columns}) > 1
        return [
            f"{self.labels[d]} {metric_format(m).header}" if several else metric_format(m).header
            for d, m in self.columns
        ]

    def row(self, method: str) -> list[pd.Series]:
        """The cells of a method, in column order."""
        return [self.cells[(dataset, method, metric)] for dataset, metric in self.columns]


def styled_text(cell: pd.Series, bold: tuple[str, str] = ("", ""), dead_mark: str = "", plus_minus: str = "±") -> str:
    """:func:`cell_text` wrapped in ``bold`` when the cell is bold, followed by ``dead_mark`` when its
    mechanism did not engage (a missing cell stays ``--``)."""
    text = cell_text(cell, plus_minus)
    if text == MISSING:
        return text
    if cell["bold"]:
        text = f"{bold[0]}{text}{bold[1]}"
    return text + (dead_mark if cell["dead"] else "")


def seed_counts(cells: pd.DataFrame) -> set[int]:
    """The numbers of seeds of the rows of ``cells`` (column ``seeds``; rows of 0 seeds, nothing measured, left out),
    for :func:`~.significance.method_text`; {1} when none was measured."""
    counts = {int(n) for n in cells["seeds"] if n > 0}
    return counts or {1}


def render_text(cells: pd.DataFrame) -> str:
    """The table as aligned plain text for a console: ``*`` marks bold cells, ``†`` a dead mechanism."""
    layout = Layout.of(cells)
    header = ["Method", *layout.headers()]
    body = [
        [layout.labels[m], *(styled_text(c, ("", "*"), PLAIN_DEAD_MARK) for c in layout.row(m))] for m in layout.methods
    ]
    widths = [max(len(line[j]) for line in [header, *body]) for j in range(len(header))]

    def line(cells_: Sequence[str]) -> str:
        return "  ".join([cells_[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells_[1:], widths[1:]))])

    notes = [method_text(seed_counts(cells), bold_name="*")]
    if cells["dead"].any():
        notes.append("†: the method's mechanism did not engage (see the .tex caption).")
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, body), "", *notes]) + "\n"


def render_markdown(cells: pd.DataFrame, caption: str) -> str:
    """The table as Markdown (bold cells in ``**``), followed by ``caption`` (plain text)."""
    layout = Layout.of(cells)
    body = [
        [layout.labels[m], *(styled_text(c, ("**", "**"), PLAIN_DEAD_MARK) for c in layout.row(m))]
        for m in layout.methods
    ]
    return markdown_table(["Method", *layout.headers()], body, caption)


def write_cells_csv(path: str | Path, cells: pd.DataFrame) -> Path:
    """Write the cells frame as CSV (full precision, empty for NaN) atomically."""
    return write_text_atomic(path, cells.to_csv(index=False, lineterminator="\n"))


def read_cells_csv(path: str | Path) -> pd.DataFrame:
    """Read a table's CSV back into a cells frame.

    Raises:
        ReportInputError: missing file (says to run ``dmlbench report``) or missing columns.
    """
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(
            f"{path}: table CSV not found; build it with `dmlbench report {path.stem}` "
            f"(or `snakemake results/tables/{path.stem}.tex`)"
        )
    try:
        cells = pd.read_csv(path, dtype={"dataset": str, "method": str, "metric": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ReportInputError(f"{path}: not a readable CSV ({err})") from err
    missing = [column for column in CELL_COLUMNS if column not in cells.columns]
    if missing:
        raise ReportInputError(f"{path}: missing column(s) {missing}; rebuild it with `dmlbench report {path.stem}`")
    return cells
