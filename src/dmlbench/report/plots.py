"""PNG plots of training curves and Recall@K (matplotlib, Agg, no pyplot state).

Both plots are deterministic: the matplotlib defaults (not the user's matplotlibrc)
plus fixed overrides, a fixed figure size and dpi, the bundled DejaVu font, and no
``Software`` entry in the PNG metadata, so identical inputs give identical bytes.
A method keeps its colour and marker in every plot (its position in the method order).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib as mpl
import matplotlib.style
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator, NullLocator

from dmlbench.atomic import write_bytes_atomic

from .collect import aggregate_over_seeds
from .spec import TableSpec

DPI = 120
PANEL_WIDTH = 4.6
PANEL_HEIGHT = 3.2
LEGEND_HEIGHT = 0.5

_COLORS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939",
]  # fmt: skip
_MARKERS = "osD^v<>pPXh*"
_RECALL = re.compile(r"^R@(\d+)$")


@contextmanager
def _style_context() -> Iterator[None]:
    """Matplotlib defaults (ignoring the user's matplotlibrc) plus a few overrides, restored on exit."""
    with (
        mpl.style.context("default"),
        mpl.rc_context(
            {
                "font.size": 9,
                "axes.titlesize": 10,
                "axes.grid": True,
                "grid.alpha": 0.3,
                "grid.linewidth": 0.6,
                "legend.frameon": False,
                "lines.linewidth": 1.6,
                "lines.markersize": 5,
            }
        ),
    ):
        yield


def _plain(text: str) -> str:
    """Text shown literally by matplotlib (a ``$`` would start mathtext)."""
    return text.replace("$", r"\$")


def _order(present: Iterable[str], preferred: list[str] | None) -> list[str]:
    """``preferred`` items that are present, in order; without a preference, sorted."""
    present = set(present)
    return [item for item in preferred if item in present] if preferred is not None else sorted(present)


def _style(methods: list[str], method: str) -> dict[str, Any]:
    index = methods.index(method)
    return {"color": _COLORS[index % len(_COLORS)], "marker": _MARKERS[index % len(_MARKERS)]}

#: width one legend entry needs (marker + a label of about 25 characters), in inches.
LEGEND_ENTRY_WIDTH_IN = 2.3


def _save(fig: Figure, handles: list[Any], labels: list[str], out_png: str | Path) -> Path:
    """Add one shared legend under the panels and write the PNG atomically."""
    if not labels:
        raise ValueError(f"{out_png}: nothing to plot for the table's datasets and methods")
    columns_that_fit = max(1, int(fig.get_figwidth() / LEGEND_ENTRY_WIDTH_IN))
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), columns_that_fit))
    return _write_png(fig, out_png)


def _write_png(fig: Figure, out_png: str | Path) -> Path:
    """Render ``fig`` as PNG (fixed dpi, no ``Software`` metadata) and write it atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return write_bytes_atomic(out_png, buffer.getvalue())


def _curve(ax: Axes, runs: pd.DataFrame, column: str, scale: float, style: dict[str, Any]) -> Any:
    """Mean over seeds per epoch, with a ±std band (ddof=1) where at least two seeds logged."""
    stats = runs.groupby("epoch")[column].agg(["mean", "std", "count"]).sort_index()
    mean, std = scale * stats["mean"], scale * stats["std"]
    (handle,) = ax.plot(stats.index, mean, color=style["color"], label="_")
    band = stats["count"] > 1
    ax.fill_between(stats.index, mean - std, mean + std, where=band, color=style["color"], alpha=0.18, linewidth=0)
    return handle


def _first_epoch_mean(runs: pd.DataFrame, column: str) -> float:
    """Mean over seeds of ``column`` in the first logged epoch; 1 when it is 0 or missing (no scaling)."""
    first = runs.loc[runs["epoch"] == runs["epoch"].min(), column].mean()
    return float(first) if pd.notna(first) and first != 0 else 1.0


def plot_training_curves(logs: pd.DataFrame, out_png: str | Path, spec: TableSpec | None = None) -> Path:
    """Per dataset, a row of two panels: training loss and validation R@1 (%) against epoch.

    Methods' losses differ in kind and scale (a margin loss near 0.1, a cross-entropy near 5), so
    each method's loss is divided by its own first-epoch mean: the panel compares how far each loss
    falls, on one axis.

    Args:
        logs: per-epoch logs from :func:`~dmlbench.report.collect.load_logs`.
        out_png: where to write the PNG (atomically).
        spec: when given, only its datasets and methods, in its order and with its labels.

    Returns:
        The written path.

    Raises:
        ValueError: when there is nothing to plot.
    """
    datasets = _order(logs["dataset"].unique(), spec.datasets if spec else None)
    methods = _order(logs["method"].unique(), spec.methods if spec else None)
    if not datasets or not methods:
        raise ValueError("no training logs to plot (for the table's datasets and methods)")
    handles: dict[str, Any] = {}
    with _style_context():
        fig = Figure(figsize=(2 * PANEL_WIDTH, PANEL_HEIGHT * len(datasets) + LEGEND_HEIGHT), layout="constrained")
        axes = fig.subplots(len(datasets), 2, squeeze=False)
        for (ax_loss, ax_r1), dataset in zip(axes, datasets, strict=True):
            name = _plain(spec.dataset_label(dataset) if spec else dataset)
            for method in methods:
                runs = logs[(logs["dataset"] == dataset) & (logs["method"] == method)]
                if runs.empty:
                    continue
                style = _style(methods, method)
                handles[method] = _curve(ax_loss, runs, "loss", 1.0 / _first_epoch_mean(runs, "loss"), style)
                _curve(ax_r1, runs, "val_R@1", 100.0, style)
            ax_loss.set(title=f"{name}: training loss", xlabel="epoch", ylabel="loss / its epoch-1 value")
            ax_r1.set(title=f"{name}: validation R@1", xlabel="epoch", ylabel="R@1 (%)")
            for ax in (ax_loss, ax_r1):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        plotted = [m for m in methods if m in handles]
        labels = [_plain(spec.method_label(m) if spec else m) for m in plotted]
        return _save(fig, [handles[m] for m in plotted], labels, out_png)


def plot_recall_at_k(results: pd.DataFrame, spec: TableSpec, out_png: str | Path) -> Path:
    """Per dataset, Recall@K (%) against K (log2 axis, ticks at the K shown), one line per method.

    Points are means over seeds, error bars the sample standard deviation (ddof=1; none
    with one seed). K values are the ``R@K`` metrics of ``spec.metrics[dataset]``.

    Returns:
        The written path.
    """
    summary = aggregate_over_seeds(results).set_index(["dataset", "method", "metric"])
    methods = list(spec.methods)
    ncols = min(len(spec.datasets), 3)
    nrows = math.ceil(len(spec.datasets) / ncols)
    handles: dict[str, Any] = {}
    with _style_context():
        fig = Figure(figsize=(PANEL_WIDTH * ncols, PANEL_HEIGHT * nrows + LEGEND_HEIGHT), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax in axes[len(spec.datasets) :]:
            ax.set_axis_off()
        for ax, dataset in zip(axes, spec.datasets, strict=False):
            ks = sorted(int(m.group(1)) for m in map(_RECALL.match, spec.metrics[dataset]) if m)
            ax.set_title(_plain(spec.dataset_label(dataset)))
            if not ks:
                ax.text(0.5, 0.5, "no R@K metrics", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            for method in methods:
                keys = [(dataset, method, f"R@{k}") for k in ks]
                points = [(k, summary.loc[key]) for k, key in zip(ks, keys, strict=True) if key in summary.index]
                if not points:
                    continue
                style = _style(methods, method)
                handles[method] = ax.errorbar(
                    [k for k, _ in points],
                    [100 * row["mean"] for _, row in points],
                    yerr=[0.0 if pd.isna(row["std"]) else 100 * row["std"] for _, row in points],
                    capsize=3,
                    **style,
                )
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(ks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(k) for k in ks])
            ax.set(xlabel="K", ylabel="Recall@K (%)")
        plotted = [m for m in methods if m in handles]
        labels = [_plain(spec.method_label(m)) for m in plotted]
        return _save(fig, [handles[m] for m in plotted], labels, out_png)
