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

from importlib import import_module
from typing import Any

#: each public name → the submodule that defines it, imported on first use: importing one submodule (e.g.
#: :mod:`.figures` or :mod:`.claims`, whose checks run with every parameter validation) imports neither the
#: others nor matplotlib.
_EXPORTS = {
    "Report": "build",
    "build_report": "build",
    "Varying": "caption",
    "caption_text": "caption",
    "merge_settings": "caption",
    "ReportInputError": "collect",
    "RunDir": "collect",
    "aggregate_over_seeds": "collect",
    "collect_runs": "collect",
    "load_logs": "collect",
    "escape_latex": "latex",
    "render_comparison_table": "latex",
    "write_table": "latex",
    "PaperNumbersError": "paper_numbers",
    "load_paper_numbers": "paper_numbers",
    "plot_recall_at_k": "plots",
    "plot_training_curves": "plots",
    "TableSpec": "spec",
    "CELL_COLUMNS": "summary",
    "read_cells_csv": "summary",
    "render_markdown": "summary",
    "render_text": "summary",
    "summarise": "summary",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


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
