"""``metric_vs_param``: a metric against a parameter value, one line per series (e.g. R@1 over attention depth).

Spec: ``metric`` (a metrics.json key, e.g. ``R@1``), ``x_label``, ``series``: legend label →
{method key: x value}; optional ``x_log: true`` (log2 x axis). Points and error bars are what a table
with these runs would print (:func:`~dmlbench.report.summary.summarise`, read by
:func:`~dmlbench.report.plots.cell_point` as the Recall@K plot does): the mean over the seeds and ± the
half-width of its 95 % confidence interval, the paired bootstrap over seeds and test queries of
:mod:`~dmlbench.report.significance` (seeds only for per-run numbers such as NMI; no bar with one seed of a
per-run number). The legend's title says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.config import ConfigError
from dmlbench.evaluation.per_query import DECOMPOSABLE
from dmlbench.layout import METRICS_FILE, PER_QUERY_FILE, RUNS_DIR, run_file
from dmlbench.report.collect import RunDir, collect_runs
from dmlbench.report.metric_format import metric_format
from dmlbench.report.plots import LEGEND_HEIGHT, PANEL_HEIGHT, PANEL_WIDTH, _plain, _save, _style_context, cell_point
from dmlbench.report.spec import TableSpec
from dmlbench.report.styles import Styles

from .common import check_methods, figure_seeds, require, title_of


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    require(spec, ("metric", "x_label", "series"), where)
    series = spec["series"]
    if not isinstance(series, Mapping) or not series:
        raise ConfigError(f"{where}.series must map legend labels to {{method: x value}}")
    for label, points in series.items():
        if not isinstance(points, Mapping) or not points:
            raise ConfigError(f"{where}.series.{label} must map method keys to x values")
        check_methods(config, points, f"{where}.series.{label}")
        bad = {m: x for m, x in points.items() if isinstance(x, bool) or not isinstance(x, int | float)}
        if bad:
            raise ConfigError(f"{where}.series.{label}: x values must be numbers, got {bad}")


def _methods(spec: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(m for points in spec["series"].values() for m in points))


#: The legend's title: what the error bars are.
LEGEND_TITLE = "bars: 95 % CI, as in the tables"


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    """Each run's metrics.json, and its per_query.npz when the metric has per-query values (the interval
    resamples the test queries)."""
    files = [METRICS_FILE, *([PER_QUERY_FILE] if DECOMPOSABLE.match(spec["metric"]) else [])]
    return [
        run_file(spec["dataset"], m, s, name)
        for m in _methods(spec)
        for s in figure_seeds(config, spec)
        for name in files
    ]


def points(
    config: Mapping[str, Any], spec: Mapping[str, Any], runs_dir: Path = RUNS_DIR
) -> dict[str, tuple[float, float]]:
    """Each method's (mean, half-width of the 95 % interval) of the spec's metric, as a table of its runs prints
    the cell (displayed units, e.g. percent); methods whose runs do not all report the metric are left out."""
    from dmlbench.report.summary import summarise

    dataset, metric, methods = spec["dataset"], spec["metric"], _methods(spec)
    runs = [RunDir.of(dataset, m, s, runs_dir) for m in methods for s in figure_seeds(config, spec)]
    table = TableSpec(datasets=[dataset], methods=methods, metrics={dataset: [metric]})
    cells = summarise(collect_runs(runs), runs, table).set_index(["dataset", "method", "metric"])
    return {m: point for m in methods if (point := cell_point(cells, dataset, m, metric)) is not None}


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    # here: every validation of the parameters imports this module
    from matplotlib.figure import Figure

    metric = spec["metric"]
    found = points(config, spec)
    missing = [m for m in _methods(spec) if m not in found]
    if missing:
        raise ValueError(f"{out_png}: runs of {missing} report no '{metric}'")
    display = metric_format(metric)
    labels = list(spec["series"])
    styles = Styles(labels)  # series are legend labels, not methods: styled in the spec's order
    handles = []
    with _style_context():
        fig = Figure(figsize=(PANEL_WIDTH, PANEL_HEIGHT + LEGEND_HEIGHT), layout="constrained")
        ax = fig.subplots()
        for label, series in spec["series"].items():
            ordered = sorted(series.items(), key=lambda item: item[1])
            container = ax.errorbar(
                [x for _, x in ordered],
                [found[m][0] for m, _ in ordered],
                yerr=[found[m][1] for m, _ in ordered],
                capsize=3,
                **styles[label].line(),
            )
            container.lines[0].set_gid(str(label))
            handles.append(container)
        if spec.get("x_log"):
            ax.set_xscale("log", base=2)
        ax.set_title(_plain(title_of(config, spec)), wrap=True)  # wrapped to the figure's width, never cut
        ax.set(xlabel=_plain(spec["x_label"]), ylabel=_plain(display.header + (" (%)" if display.scale == 100 else "")))
        _save(fig, handles, [_plain(str(label)) for label in labels], out_png, LEGEND_TITLE)
