"""``training_curves``: log.csv columns against epoch (mean over seeds, a band of the tables' 95 % interval
over seeds), one panel per column; each method in its style of every plot of the project (:mod:`..styles`).

Spec: ``methods`` (keys), ``columns`` (log.csv columns, e.g. ``val_R@1``, ``train_R@1``,
``test_R@1``, ``loss`` or a recipe's own). Recall columns are shown in percent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dmlbench.config import ConfigError, resolve_run
from dmlbench.layout import LOG_FILE, run_file
from dmlbench.report.collect import RunDir, load_logs
from dmlbench.report.plots import (
    CURVES_LEGEND_TITLE,
    LEGEND_HEIGHT,
    PANEL_HEIGHT,
    PANEL_WIDTH,
    _curve,
    _plain,
    _save,
    _style_context,
)
from dmlbench.report.styles import Styles

from .common import check_methods, figure_seeds, method_label, require, title_of


#: log.csv columns that a run fills only when its training settings ask for them: column → (whether a run's
#: resolved ``training`` logs it, the setting that turns it on).
LOGGED_WHEN: dict[str, tuple[Callable[[Mapping[str, Any]], bool], str]] = {
    "train_R@1": (lambda training: bool(training.get("log_train_recall")), "training.log_train_recall: true"),
    "test_R@1": (
        lambda training: training["selection"] == "test" or bool(training.get("log_test_recall")),
        "training.log_test_recall: true",
    ),
}


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("methods", "columns"), where)
    methods = check_methods(config, spec["methods"], f"{where}.methods", trained=LOG_FILE)
    columns = spec["columns"]
    if not columns or not all(isinstance(c, str) for c in columns) or len(set(columns)) != len(columns):
        raise ConfigError(f"{where}.columns must list log.csv column names, each once; got {columns!r}")
    trainings = {method: resolve_run(config, spec["dataset"], method, 0)["training"] for method in methods}
    for column, (logged, setting) in LOGGED_WHEN.items():
        silent = [method for method, training in trainings.items() if column in columns and not logged(training)]
        if silent:
            raise ConfigError(
                f"{where}.columns names {column!r}, but {silent} do not log it on {spec['dataset']}, "
                f"so their curves would be missing from its panel: set {setting} for them, or drop "
                f"the column"
            )


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    return [run_file(spec["dataset"], m, s, LOG_FILE) for m in spec["methods"] for s in figure_seeds(config, spec)]


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    # here: every validation of the parameters imports this module
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    dataset, methods, columns = spec["dataset"], list(spec["methods"]), list(spec["columns"])
    logs = load_logs([RunDir.of(dataset, m, s) for m in methods for s in figure_seeds(config, spec)])
    absent = [c for c in columns if c not in logs.columns or logs[c].isna().all()]
    if absent:
        raise ValueError(f"{out_png}: no run logged {absent}; enable them (e.g. training.log_train_recall: true)")
    styles = Styles.from_config(config)
    handles: dict[str, Any] = {}
    with _style_context():
        fig = Figure(figsize=(PANEL_WIDTH * len(columns), PANEL_HEIGHT + LEGEND_HEIGHT), layout="constrained")
        axes = fig.subplots(1, len(columns), squeeze=False)[0]
        for ax, column in zip(axes, columns, strict=True):
            scale = 100.0 if "R@" in column else 1.0
            for mark, method in enumerate(methods):
                runs = logs[(logs["method"] == method) & logs[column].notna()]
                if not runs.empty:
                    handles[method] = _curve(ax, runs, column, scale, styles[method], mark)
            ax.set(title=_plain(column), xlabel="epoch", ylabel=_plain(column + (" (%)" if scale == 100 else "")))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(_plain(title_of(config, spec)), wrap=True)  # wrapped to the figure's width, never cut
        plotted = [m for m in methods if m in handles]
        _save(
            fig,
            [handles[m] for m in plotted],
            [_plain(method_label(config, m)) for m in plotted],
            out_png,
            CURVES_LEGEND_TITLE,
        )
