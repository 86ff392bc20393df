"""Helpers shared by the figure kinds: seeds, method checks, labels (run paths: :mod:`dmlbench.layout`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dmlbench.config import ConfigError, has_training, logs_epochs, resolve_method
from dmlbench.layout import LOG_FILE
from dmlbench.report.plots import LEGEND_HEIGHT, PANEL_HEIGHT, PANEL_WIDTH

if TYPE_CHECKING:  # matplotlib is imported where a figure is drawn, not for the checks every validation runs
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def figure_seeds(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[int]:
    """The figure's ``seeds``, else the top-level ``seeds``."""
    return [int(s) for s in spec.get("seeds", config["seeds"])]


def check_methods(
    config: Mapping[str, Any], methods: Iterable[Any], where: str, *, trained: str | None = None
) -> list[str]:
    """Every name is a defined method, named once; returns them as a list.

    Args:
        trained: the run file the figure reads (``log.csv``, ``checkpoint.pt``) when only methods
            that the workflow trains themselves have it; None when any method will do.
    """
    methods = list(methods)
    if not methods:
        raise ConfigError(f"{where}: names no method")
    unknown = [m for m in methods if m not in config.get("methods", {})]
    if unknown:
        raise ConfigError(f"{where}: methods {unknown} are not defined under 'methods'")
    repeated = list(dict.fromkeys(m for m in methods if methods.count(m) > 1))
    if repeated:
        raise ConfigError(f"{where}: lists {repeated} more than once; name each method once")
    untrained = [m for m in methods if trained and not has_training(config, m)]
    if untrained:
        raise ConfigError(
            f"{where}: methods {untrained} are not trained themselves (ensemble_members or "
            f"checkpoint_of), so they have no {trained}; name the method they come from"
        )
    unlogged = [m for m in methods if trained == LOG_FILE and not logs_epochs(config, m)]
    if unlogged:
        raise ConfigError(
            f"{where}: methods {unlogged} are reference rows (recipe: reference, no epochs), so "
            f"their {trained} is empty; leave them out"
        )
    return methods


def require(spec: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
    """Every key is present in the figure spec."""
    missing = [key for key in keys if key not in spec]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")


def method_label(config: Mapping[str, Any], method: str) -> str:
    """Display name of a method (its own or inherited ``label``, else the key)."""
    return str(resolve_method(config, method).get("label", method))


def title_of(config: Mapping[str, Any], spec: Mapping[str, Any]) -> str:
    """The figure title, else the dataset label."""
    dataset = config["datasets"][spec["dataset"]]
    return str(spec.get("title") or dataset.get("label", spec["dataset"]))


def panel_grid(count: int, max_columns: int = 4) -> tuple[Figure, list[Axes]]:
    """A figure with ``count`` panels in rows of at most ``max_columns`` (unused cells hidden), room
    for a legend below; call inside the plots' style context."""
    from matplotlib.figure import Figure

    ncols = min(count, max_columns)
    nrows = -(-count // ncols)
    fig = Figure(figsize=(PANEL_WIDTH * ncols, PANEL_HEIGHT * nrows + LEGEND_HEIGHT), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.set_axis_off()
    return fig, list(axes[:count])
