"""``training_curves``: log.csv columns against epoch (mean over seeds, ±std band), one panel per column.

Spec: ``methods`` (keys), ``columns`` (log.csv columns, e.g. ``val_R@1``, ``train_R@1``,
``test_R@1``, ``loss`` or a recipe's own). Recall columns are shown in percent.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dmlbench.config import ConfigError
from dmlbench.report.collect import RunDir, load_logs
from dmlbench.report.plots import LEGEND_HEIGHT, PANEL_HEIGHT, PANEL_WIDTH, _curve, _plain, _save, _style, _style_context

from .common import RUNS_DIR, check_methods, figure_seeds, method_label, require, run_file, title_of


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("methods", "columns"), where)
    check_methods(config, spec["methods"], f"{where}.methods", trained="log.csv")
    if not spec["columns"] or not all(isinstance(c, str) for c in spec["columns"]):
        raise ConfigError(f"{where}.columns must list log.csv column names")


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    return [run_file(spec["dataset"], m, s, "log.csv") for m in spec["methods"] for s in figure_seeds(config, spec)]


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    dataset, methods, columns = spec["dataset"], list(spec["methods"]), list(spec["columns"])
    logs = load_logs([RunDir(dataset, m, s, RUNS_DIR / dataset / m / f"seed{s}")
                      for m in methods for s in figure_seeds(config, spec)])
    absent = [c for c in columns if c not in logs.columns or logs[c].isna().all()]
    if absent:
        raise ValueError(f"{out_png}: no run logged {absent}; enable them (e.g. training.log_train_recall: true)")
    handles: dict[str, Any] = {}
    with _style_context():
        fig = Figure(figsize=(PANEL_WIDTH * len(columns), PANEL_HEIGHT + LEGEND_HEIGHT), layout="constrained")
        axes = fig.subplots(1, len(columns), squeeze=False)[0]
        for ax, column in zip(axes, columns, strict=True):
            scale = 100.0 if "R@" in column else 1.0
            for method in methods:
                runs = logs[(logs["method"] == method) & logs[column].notna()]
                if not runs.empty:
                    handles[method] = _curve(ax, runs, column, scale, _style(methods, method))
            ax.set(title=_plain(f"{title_of(config, spec)}: {column}"), xlabel="epoch",
                   ylabel=_plain(column + (" (%)" if scale == 100 else "")))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        plotted = [m for m in methods if m in handles]
        _save(fig, [handles[m] for m in plotted], [_plain(method_label(config, m)) for m in plotted], out_png)
