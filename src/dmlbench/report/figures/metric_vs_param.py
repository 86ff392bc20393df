"""``metric_vs_param``: a metric against a parameter value, one line per series (e.g. R@1 over attention depth).

Spec: ``metric`` (a metrics.json key, e.g. ``R@1``), ``x_label``, ``series``: legend label →
{method key: x value}; optional ``x_log: true`` (log2 x axis). Points are means over the
seeds with sample-std error bars.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.config import ConfigError
from dmlbench.report.collect import RunDir, aggregate_over_seeds, collect_runs
from dmlbench.report.metric_format import metric_format
from dmlbench.report.plots import LEGEND_HEIGHT, PANEL_HEIGHT, PANEL_WIDTH, _plain, _save, _style_context
from dmlbench.report.styles import Styles

from .common import RUNS_DIR, check_methods, figure_seeds, require, run_file, title_of


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


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    return [run_file(spec["dataset"], m, s, "metrics.json") for m in _methods(spec) for s in figure_seeds(config, spec)]


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    # here: every validation of the parameters imports this module
    from matplotlib.figure import Figure

    dataset, metric = spec["dataset"], spec["metric"]
    runs = [RunDir(dataset, m, s, RUNS_DIR / dataset / m / f"seed{s}")
            for m in _methods(spec) for s in figure_seeds(config, spec)]
    summary = aggregate_over_seeds(collect_runs(runs)).set_index(["method", "metric"])
    display = metric_format(metric)
    labels = list(spec["series"])
    styles = Styles(labels)  # series are legend labels, not methods: styled in the spec's order
    handles = []
    with _style_context():
        fig = Figure(figsize=(PANEL_WIDTH, PANEL_HEIGHT + LEGEND_HEIGHT), layout="constrained")
        ax = fig.subplots()
        for label, points in spec["series"].items():
            ordered = sorted(points.items(), key=lambda item: item[1])
            missing = [m for m, _ in ordered if (m, metric) not in summary.index]
            if missing:
                raise ValueError(f"{out_png}: runs of {missing} report no '{metric}'")
            rows = [summary.loc[(m, metric)] for m, _ in ordered]
            handles.append(ax.errorbar(
                [x for _, x in ordered], [display.scale * r["mean"] for r in rows],
                yerr=[0.0 if r["std"] != r["std"] else display.scale * r["std"] for r in rows],
                capsize=3, **styles[label].line(),
            ))
        if spec.get("x_log"):
            ax.set_xscale("log", base=2)
        ax.set_title(_plain(title_of(config, spec)), wrap=True)  # wrapped to the figure's width, never cut
        ax.set(xlabel=_plain(spec["x_label"]),
               ylabel=_plain(display.header + (" (%)" if display.scale == 100 else "")))
        _save(fig, handles, [_plain(str(label)) for label in labels], out_png)
