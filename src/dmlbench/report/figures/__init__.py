"""Figures of the papers' experiments: ``figures.<name>`` in params → ``results/plots/<name>.png``.

Each kind is a module with three functions:

- ``check(config, spec, where)``: raise :class:`~dmlbench.config.ConfigError` naming the key;
- ``inputs(config, spec)``: the workflow files it reads (paths relative to the project root);
- ``render(config, spec, out_png)``: draw and write the PNG atomically.

Common keys of every spec: ``kind``, ``dataset``, optional ``title`` and ``seeds``
(default: the top-level ``seeds``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from dmlbench.config import ConfigError, section
from dmlbench.registry import Registry

#: kind → module implementing it (imported on first use).
FIGURE_KINDS: Registry[ModuleType] = Registry(
    "figure kind",
    {
        "metric_vs_param": "dmlbench.report.figures.metric_vs_param",
        "training_curves": "dmlbench.report.figures.training_curves",
        "similarity_histogram": "dmlbench.report.figures.similarity_histogram",
        "attention_maps": "dmlbench.report.figures.attention_maps",
        "cluster_distances": "dmlbench.report.figures.cluster_distances",
        "retrieval_grid": "dmlbench.report.figures.retrieval_grid",
    },
)


def _kind_module(config: Mapping[str, Any], name: str, source: str = "params") -> ModuleType:
    kind = section(config, "figures", name).get("kind")
    return FIGURE_KINDS.lookup(kind, key=f"{source}: figures.{name}.kind", error=ConfigError)


def check_figure(config: Mapping[str, Any], name: str, source: str = "params") -> None:
    """Validate ``figures.<name>`` (kind, dataset, methods it names, kind-specific keys)."""
    spec = section(config, "figures", name)
    if spec.get("dataset") not in config.get("datasets", {}):
        raise ConfigError(f"{source}: figures.{name}.dataset = {spec.get('dataset')!r} is not defined under 'datasets'")
    _kind_module(config, name, source).check(config, spec, f"{source}: figures.{name}")


def figure_inputs(config: Mapping[str, Any], name: str) -> list[str]:
    """Files ``figures.<name>`` reads (for the workflow rule's inputs)."""
    return list(_kind_module(config, name).inputs(config, section(config, "figures", name)))


def render_figure(config: Mapping[str, Any], name: str, out_png: str | Path) -> Path:
    """Draw ``figures.<name>`` into ``out_png`` (atomically); returns the path."""
    check_figure(config, name)
    _kind_module(config, name).render(config, section(config, "figures", name), Path(out_png))
    return Path(out_png)


__all__ = ["FIGURE_KINDS", "check_figure", "figure_inputs", "render_figure"]
