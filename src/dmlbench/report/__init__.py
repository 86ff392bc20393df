"""The report step: LaTeX comparison tables and PNG plots from per-run results.

- :mod:`.collect` — load ``metrics.json`` / ``per_query.npz`` / ``log.csv`` of each run (errors name the file);
- :mod:`.significance` — bootstrap confidence intervals over seeds and test queries, the paired test;
- :mod:`.summary` — the cells (mean ± 95 % CI, bold = not significantly worse than the best), CSV,
  Markdown and console text;
- :mod:`.latex` — booktabs comparison tables from those cells;
- :mod:`.caption` — captions stating protocol, backbone, sizes, epochs and seeds;
- :mod:`.plots` — training curves and Recall@K plots (deterministic PNGs);
- :mod:`.paper_numbers` — numbers transcribed from the papers, shown as reference rows;
- :mod:`.build` — :func:`build_report`, what the CLI calls.
"""

from .build import Report, build_report
from .caption import Varying, caption_text, merge_settings
from .collect import ReportInputError, RunDir, aggregate_over_seeds, collect_runs, load_logs
from .latex import escape_latex, render_comparison_table, write_table
from .paper_numbers import PaperNumbersError, load_paper_numbers
from .plots import plot_recall_at_k, plot_training_curves
from .spec import TableSpec
from .summary import CELL_COLUMNS, read_cells_csv, render_markdown, render_text, summarise

__all__ = [
    "CELL_COLUMNS",
    "PaperNumbersError",
    "ReportInputError",
    "Report",
    "RunDir",
    "TableSpec",
    "Varying",
    "aggregate_over_seeds",
    "build_report",
    "caption_text",
    "collect_runs",
    "escape_latex",
    "load_logs",
    "load_paper_numbers",
    "merge_settings",
    "plot_recall_at_k",
    "plot_training_curves",
    "read_cells_csv",
    "render_comparison_table",
    "render_markdown",
    "render_text",
    "summarise",
    "write_table",
]
