"""PNG plots of training curves and Recall@K (matplotlib, Agg, no pyplot state).

Both plots are deterministic: the matplotlib defaults (not the user's matplotlibrc)
plus fixed overrides, a fixed figure size and dpi, the bundled DejaVu font, and no
``Software`` entry in the PNG metadata, so identical inputs give identical bytes.
A method keeps its colour, marker and line style in every plot of a project (:mod:`.styles`); legends
sit outside the panels, and the figure grows to hold them whole.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from dmlbench.atomic import write_bytes_atomic

from .metric_format import metric_format
from .significance import bootstrap_means, percentile_interval
from .spec import TableSpec
from .styles import Style, Styles

# matplotlib is imported where a plot is drawn: the figure modules import this one for their checks, which
# every validation of the parameters runs
if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 120
PANEL_WIDTH = 4.6
PANEL_HEIGHT = 3.2
#: Room below the panels for a one-row legend with a title (inches); a legend that needs more grows the figure.
LEGEND_HEIGHT = 0.7
#: Free space between a legend and the figure's edges (inches).
LEGEND_MARGIN = 0.1
#: How much smaller (a share of its area) a figure with the legend at the right must be to be preferred.
LEGEND_RIGHT_GAIN = 0.1
#: A legend placement: (``loc``, columns, figure size in inches (width, height)).
_Placement = tuple[Literal["outside lower center", "outside right upper"], int, tuple[float, float]]
#: Total spread of the methods' points around each K (in octaves of the log2 axis), so that no method's marker
#: and error bar hides another's.
DODGE = 0.5
#: Markers per training curve (about; fewer with fewer epochs).
CURVE_MARKERS = 6

_RECALL = re.compile(r"^R@(\d+)$")


@contextmanager
def _style_context() -> Iterator[None]:
    """Matplotlib defaults (ignoring the user's matplotlibrc) plus a few overrides, restored on exit."""
    import matplotlib as mpl
    import matplotlib.style

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


def _renderer(fig: Figure) -> Any:
    """An Agg renderer of ``fig`` (what :func:`_write_png` draws with), to measure text before saving."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    return canvas.get_renderer()


def _legend_size(
    fig: Figure, handles: list[Any], labels: list[str], ncols: int, title: str | None
) -> tuple[float, float]:
    """Width and height (inches) of a figure legend of ``ncols`` columns."""
    legend = fig.legend(handles, labels, ncols=ncols, title=title)
    box = legend.get_window_extent(_renderer(fig))
    legend.remove()
    return box.width / fig.dpi, box.height / fig.dpi


def _add_legend(fig: Figure, handles: list[Any], labels: list[str], title: str | None = None) -> Any:
    """One legend for the figure, outside its panels, and the figure grown so that all of it shows.

    Candidates: below the panels in as many columns as the figure's width holds (the figure grows taller by
    what the rows need beyond :data:`LEGEND_HEIGHT`), and right of the panels in 1 to 4 columns (the figure
    grows wider, gives back the room below and grows taller only if the legend is taller than the panels).
    Below is used unless a place at the right makes the figure smaller by more than
    :data:`LEGEND_RIGHT_GAIN`: a legend of a few entries keeps the figure's size, a long one beside a
    single panel goes to its right rather than doubling the figure's height.
    """
    width, height = fig.get_figwidth(), fig.get_figheight()
    margin = 2 * LEGEND_MARGIN
    below: _Placement | None = None
    for ncols in range(len(labels), 0, -1):  # the most columns that fit the width (1 if none does)
        legend_w, legend_h = _legend_size(fig, handles, labels, ncols, title)
        if legend_w + margin <= width or ncols == 1:
            below = (
                "outside lower center",
                ncols,
                (max(width, legend_w + margin), height + max(0.0, legend_h + margin - LEGEND_HEIGHT)),
            )
            break
    rights: list[_Placement] = []
    for ncols in range(1, min(len(labels), 4) + 1):
        legend_w, legend_h = _legend_size(fig, handles, labels, ncols, title)
        rights.append(
            ("outside right upper", ncols, (width + legend_w + margin, max(height - LEGEND_HEIGHT, legend_h + margin)))
        )

    def area(choice: _Placement) -> float:
        return choice[2][0] * choice[2][1]

    right = min(rights, key=area)
    assert below is not None  # one column is always taken
    loc, ncols, size = right if area(right) < (1 - LEGEND_RIGHT_GAIN) * area(below) else below
    fig.set_size_inches(*size)
    return fig.legend(handles, labels, loc=loc, ncols=ncols, title=title)


def _save(fig: Figure, handles: list[Any], labels: list[str], out_png: str | Path, title: str | None = None) -> Path:
    """Add one shared legend outside the panels (:func:`_add_legend`) and write the PNG atomically."""
    if not labels:
        raise ValueError(f"{out_png}: nothing to plot for the table's datasets and methods")
    _add_legend(fig, handles, labels, title)
    return _write_png(fig, out_png)


def _write_png(fig: Figure, out_png: str | Path) -> Path:
    """Render ``fig`` as PNG (fixed dpi, no ``Software`` metadata) and write it atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return write_bytes_atomic(out_png, buffer.getvalue())


def seed_half_widths(values: np.ndarray) -> np.ndarray:
    """Half-widths of the tables' 95 % interval of per-run numbers, per column of ``values``.

    Args:
        values: (S, E) one number per seed (rows, in seed order) and column (e.g. epochs); NaN where a seed
            has none.

    Returns:
        (E,) half the width of the percentile interval of :func:`~.significance.bootstrap_means` over the seeds
        that have the column (what a table cell of a per-run number shows after ±); NaN with fewer than two.
    """
    present = ~np.isnan(values)
    half = np.full(values.shape[1], np.nan)
    groups: dict[tuple[bool, ...], list[int]] = {}
    for column in range(values.shape[1]):
        groups.setdefault(tuple(present[:, column]), []).append(column)
    for pattern, columns in groups.items():
        seeds = np.flatnonzero(pattern)
        if len(seeds) < 2:
            continue
        low, high = percentile_interval(bootstrap_means(values[np.ix_(seeds, np.asarray(columns))][:, None, :]))
        half[columns] = (high - low) / 2
    return half


def _curve(ax: Axes, runs: pd.DataFrame, column: str, scale: float, style: Style, mark: int = 0) -> Any:
    """Mean over seeds per epoch, in the method's style, with a band of the tables' 95 % interval for per-run
    numbers (the seed bootstrap of :func:`seed_half_widths`) where at least two seeds logged the epoch.

    ``mark`` staggers the markers (one every few epochs) of the methods of one panel.
    """
    wide = runs.pivot(index="seed", columns="epoch", values=column).sort_index(axis=1)
    epochs = wide.columns.to_numpy()
    mean = scale * wide.mean(axis=0).to_numpy()
    half = scale * seed_half_widths(wide.to_numpy(dtype=float))
    step = max(1, round(len(epochs) / CURVE_MARKERS))
    (handle,) = ax.plot(epochs, mean, **style.line(), markevery=(mark % step, step), markersize=4, label="_")
    handle.set_gid(runs["method"].iloc[0])
    band = ~np.isnan(half)
    ax.fill_between(
        epochs,
        mean - np.where(band, half, 0),
        mean + np.where(band, half, 0),
        where=band,
        color=style.color,
        alpha=0.15,
        linewidth=0,
    )
    return handle


def _first_epoch_mean(runs: pd.DataFrame, column: str) -> float:
    """Mean over seeds of ``column`` in the first logged epoch; 1 when it is 0 or missing (no scaling)."""
    first = runs.loc[runs["epoch"] == runs["epoch"].min(), column].mean()
    return float(first) if pd.notna(first) and first != 0 else 1.0


#: Legend titles: what the bands and error bars are.
CURVES_LEGEND_TITLE = "bands: 95 % CI over seeds"
RECALL_LEGEND_TITLE = "bars: 95 % CI, as in the table"


def plot_training_curves(logs: pd.DataFrame, out_png: str | Path, spec: TableSpec | None = None) -> Path:
    """Per dataset, a row of two panels: training loss and validation R@1 (%) against epoch.

    Methods' losses differ in kind and scale (a margin loss near 0.1, a cross-entropy near 5), so
    each method's loss is divided by its own first-epoch mean: the panel compares how far each loss
    falls, on one axis. Each method has its style of every plot (:meth:`TableSpec.styles`); reference
    rows log no epochs and are not drawn.

    Args:
        logs: per-epoch logs from :func:`~dmlbench.report.collect.load_logs`.
        out_png: where to write the PNG (atomically).
        spec: when given, only its datasets and methods, in its order, with its labels and styles.

    Returns:
        The written path.

    Raises:
        ValueError: when there is nothing to plot.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    datasets = _order(logs["dataset"].unique(), spec.datasets if spec else None)
    methods = _order(logs["method"].unique(), spec.methods if spec else None)
    if not datasets or not methods:
        raise ValueError("no training logs to plot (for the table's datasets and methods)")
    styles = spec.styles() if spec else Styles(methods)
    handles: dict[str, Any] = {}
    with _style_context():
        fig = Figure(figsize=(2 * PANEL_WIDTH, PANEL_HEIGHT * len(datasets) + LEGEND_HEIGHT), layout="constrained")
        axes = fig.subplots(len(datasets), 2, squeeze=False)
        for (ax_loss, ax_r1), dataset in zip(axes, datasets, strict=True):
            name = _plain(spec.dataset_label(dataset) if spec else dataset)
            for mark, method in enumerate(methods):
                runs = logs[(logs["dataset"] == dataset) & (logs["method"] == method)]
                if runs.empty:
                    continue
                style = styles[method]
                handles[method] = _curve(ax_loss, runs, "loss", 1.0 / _first_epoch_mean(runs, "loss"), style, mark)
                _curve(ax_r1, runs, "val_R@1", 100.0, style, mark)
            ax_loss.set(title=f"{name}: training loss", xlabel="epoch", ylabel="loss / its epoch-1 value")
            ax_r1.set(title=f"{name}: validation R@1", xlabel="epoch", ylabel="R@1 (%)")
            for ax in (ax_loss, ax_r1):
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        plotted = [m for m in methods if m in handles]
        labels = [_plain(spec.method_label(m) if spec else m) for m in plotted]
        return _save(fig, [handles[m] for m in plotted], labels, out_png, CURVES_LEGEND_TITLE)


#: The columns of a table's cells (:func:`~dmlbench.report.summary.summarise`) that the Recall@K plot reads.
CELL_INPUT = ("dataset", "method", "metric", "mean", "ci_low", "ci_high")


def cell_point(cells: pd.DataFrame, dataset: str, method: str, metric: str) -> tuple[float, float] | None:
    """The mean and ± half-width of one table cell as the table shows it (its metric's display scale, e.g.
    percent; half-width 0 without an interval), or None when the cell has no mean.

    Args:
        cells: a table's cells (:func:`~dmlbench.report.summary.summarise`) indexed by (dataset, method, metric).
    """
    key = (dataset, method, metric)
    if key not in cells.index or pd.isna(cells.loc[key, "mean"]):
        return None
    cell = cells.loc[key]
    scale = metric_format(metric).scale
    half = 0.0 if pd.isna(cell["ci_low"]) else scale * (cell["ci_high"] - cell["ci_low"]) / 2
    return scale * float(cell["mean"]), float(half)


def _recall_points(cells: pd.DataFrame, dataset: str, method: str, ks: list[int]) -> list[tuple[int, float, float]]:
    """(K, mean, half-width) in percent of the cells of one row that have a mean (half-width 0 without an
    interval), exactly as the table shows them."""
    return [(k, *point) for k in ks if (point := cell_point(cells, dataset, method, f"R@{k}")) is not None]


def _axis_range(rows: Iterable[list[tuple[int, float, float]]]) -> tuple[float, float]:
    """The y range (percent) that holds every mean ± half-width of ``rows``, with a margin."""
    values = [(mean - half, mean + half) for points in rows for _, mean, half in points]
    low, high = min(v[0] for v in values), max(v[1] for v in values)
    pad = max(0.08 * (high - low), 1.0)
    return max(low - pad, 0.0 if low >= 0 else low - pad), min(high + pad, 100.0 if high <= 100 else high + pad)


def _off_axis_note(
    label: str, points: list[tuple[int, float, float]], low: float, high: float
) -> tuple[str, str] | None:
    """``("below" | "above", text)`` naming a reference row's means that lie off the y range, or None."""
    off = [(k, mean) for k, mean, _ in points if not low <= mean <= high]
    if not off:
        return None
    side = "below" if off[0][1] < low else "above"
    arrow = "↓" if side == "below" else "↑"
    if len(off) == len(points):
        values = [mean for _, mean in off]
        where = f"{min(values):.1f}–{max(values):.1f} %" if len(values) > 1 else f"{values[0]:.1f} %"
    else:
        where = "K = " + ", ".join(str(k) for k, _ in off) + ": " + ", ".join(f"{m:.1f}" for _, m in off) + " %"
    return side, f"{arrow} {label}:\n{where}, {side} the axis"


def plot_recall_at_k(cells: pd.DataFrame, spec: TableSpec, out_png: str | Path) -> Path:
    """Per dataset, Recall@K (%) against K (log2 axis, ticks at the K shown), one line per method.

    Points and error bars are the table's own cells: the mean and ± the half-width of its 95 % bootstrap
    interval (:func:`~dmlbench.report.summary.summarise`, the numbers the table prints; no bar without an
    interval). K values are the ``R@K`` metrics of ``spec.metrics[dataset]``. Each method has its style of
    every plot (:meth:`TableSpec.styles`); the points of the methods are spread a little around each K so
    that none hides another. The y axis fits the trained methods: reference rows (``spec.references``) are
    dashed and grey, and those off that range are named, with their values, at the panel's edge.

    Args:
        cells: the table's cells (:data:`~dmlbench.report.summary.CELL_COLUMNS`).
        spec: the table's datasets, methods, metrics, labels and reference rows.
        out_png: where to write the PNG (atomically).

    Returns:
        The written path.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    missing = [column for column in CELL_INPUT if column not in cells.columns]
    if missing:
        raise ValueError(
            f"{out_png}: the Recall@K plot draws a table's cells (dmlbench.report.summarise); these lack {missing}"
        )
    cells = cells.set_index(["dataset", "method", "metric"]).sort_index()
    styles = spec.styles()
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
            rows = {m: points for m in spec.methods if (points := _recall_points(cells, dataset, m, ks))}
            if not rows:
                continue
            trained = [m for m in rows if not spec.is_reference(m)]
            low, high = _axis_range(rows[m] for m in (trained or rows))
            for i, (method, points) in enumerate(rows.items()):
                shift = 2.0 ** (DODGE * ((i + 0.5) / len(rows) - 0.5))
                style = styles[method]
                if trained and style.reference:  # off the trained methods' range: named in a note, not drawn
                    points = [(k, mean if low <= mean <= high else math.nan, half) for k, mean, half in points]
                container = ax.errorbar(
                    [k * shift for k, _, _ in points],
                    [mean for _, mean, _ in points],
                    yerr=[half for _, _, half in points],
                    capsize=2,
                    elinewidth=0.9,
                    linewidth=1.2 if style.reference else 1.4,
                    zorder=1.8 if style.reference else 2.0,
                    **style.line(),
                )
                container.lines[0].set_gid(method)
                handles[method] = container
            notes: dict[str, list[tuple[str, str]]] = {"below": [], "above": []}
            for method, points in rows.items():
                if spec.is_reference(method) and trained:
                    note = _off_axis_note(_plain(spec.method_label(method)), points, low, high)
                    if note:
                        notes[note[0]].append((method, note[1]))
            for side, entries in notes.items():
                for j, (method, text) in enumerate(entries):
                    y = 0.03 + 0.14 * j if side == "below" else 0.97 - 0.14 * j
                    ax.text(
                        0.98 if side == "below" else 0.02,
                        y,
                        text,
                        transform=ax.transAxes,
                        fontsize=7.5,
                        ha="right" if side == "below" else "left",
                        va="bottom" if side == "below" else "top",
                        multialignment="right" if side == "below" else "left",
                        color=styles[method].color,
                        gid=f"off-axis:{method}",
                        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlim(min(ks) * 2.0 ** -(DODGE / 2 + 0.25), max(ks) * 2.0 ** (DODGE / 2 + 0.25))
            ax.xaxis.set_major_locator(FixedLocator(ks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(k) for k in ks])
            ax.set_ylim(low, high)
            ax.set(xlabel="K", ylabel="Recall@K (%)")
        plotted = [m for m in spec.methods if m in handles]
        labels = [_plain(spec.method_label(m)) for m in plotted]
        return _save(fig, [handles[m] for m in plotted], labels, out_png, RECALL_LEGEND_TITLE)
