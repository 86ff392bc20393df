"""Check every planned run's method before any job starts (``snakemake -n`` included).

A recipe, its options, its loss and the backbone name are otherwise first built inside the train
job, so an unknown loss name or an embedding size that the learners do not divide would surface
only after the earlier jobs had run. :func:`check_planned_methods` builds, for every (dataset,
method) pair that a table or a figure names (and every other method once, on a dataset of its
choosing), the recipe and its loss — no network, no weights — and turns the first failure into a
:class:`~dmlbench.config.ConfigError` naming the method, the dataset and the problem.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dmlbench.config import ConfigError, resolve_run
from dmlbench.methods import build_recipe
from dmlbench.models.backbones import check_backbone
from dmlbench.models.backbones.weights import PretrainedWeightsError

#: Classes of the stand-in training set a proxy loss is built for (its size does not matter here).
CHECK_CLASSES = 2


def _method_names(node: Any, methods: Mapping[str, Any]) -> Iterator[str]:
    """Every string in a table or figure spec that names a method."""
    if isinstance(node, str):
        if node in methods:
            yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _method_names(value, methods)
    elif isinstance(node, list):
        for value in node:
            yield from _method_names(value, methods)


def planned_pairs(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(dataset, method) pairs of the tables and figures, then each remaining method on the first dataset."""
    methods = config.get("methods", {})
    pairs: dict[tuple[str, str], None] = {}
    for table in config.get("tables", {}).values():
        for dataset in table.get("datasets", []):
            for method in table.get("methods", []):
                pairs[(dataset, method)] = None
    for figure in config.get("figures", {}).values():
        for method in _method_names({k: v for k, v in figure.items() if k != "dataset"}, methods):
            pairs[(figure["dataset"], method)] = None
    covered = {method for _, method in pairs}
    fallback = next(iter(config.get("datasets", {})), None)
    for method in methods:
        if method not in covered and fallback is not None:
            pairs[(fallback, method)] = None
    return list(pairs)


def check_planned_methods(config: Mapping[str, Any], source: str = "params") -> None:
    """Build the recipe (options, cut-point-free checks) and the loss of every planned run.

    Raises:
        ConfigError: ``{source}: methods.<m> on <dataset>: <problem>`` for the first pair that fails.
    """
    for dataset, method in planned_pairs(config):
        try:
            run = resolve_run(config, dataset, method, 0)
            check_backbone(run["training"]["backbone"])
            recipe = build_recipe(run)
            if "loss" in run["method_config"]:
                recipe.build_loss(CHECK_CLASSES)
        except (KeyError, ValueError, TypeError, PretrainedWeightsError) as err:
            message = err.args[0] if isinstance(err, KeyError) and err.args else err
            raise ConfigError(f"{source}: methods.{method} on {dataset}: {message}") from err
