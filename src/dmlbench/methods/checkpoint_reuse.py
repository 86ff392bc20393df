"""Checkpoint reuse: a method with ``checkpoint_of: <method>`` re-embeds that method's checkpoints, so the two
may differ only in what does not change the trained network (see :mod:`dmlbench.config`).

Reads the recipes' test-time options from the registry's copy (:data:`dmlbench.methods.RECIPE_TEST_TIME_OPTIONS`),
so checking the parameters imports no recipe and no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.config import PRESENTATION_KEYS, ConfigError, differing_keys, has_training, resolve_method
from dmlbench.methods import recipe_test_time_options


def training_differences(trained: Mapping[str, Any], reused: Mapping[str, Any]) -> list[str]:
    """Dotted keys where two resolved method sections (:func:`~dmlbench.config.resolve_method`, or a run's
    ``method_config`` with its ``training``) differ in a way that changes the trained network:
    every key but :data:`~dmlbench.config.PRESENTATION_KEYS` and the recipe's test-time options
    (``Recipe.TEST_TIME_OPTIONS``); ``['recipe']`` when the recipes differ."""
    if trained.get("recipe") != reused.get("recipe"):
        return ["recipe"]
    ignored = {*PRESENTATION_KEYS, *(f"options.{name}" for name in recipe_test_time_options(trained["recipe"]))}
    return [key for key in differing_keys(trained, reused) if key not in ignored]


def check_checkpoint_source(config: Mapping[str, Any], method: str, source: str = "params") -> None:
    """``methods.<method>.checkpoint_of`` names another trained method that trains exactly like
    ``method`` on every dataset (see the module doc).

    Raises:
        ConfigError: naming the first differing keys and the two ways out.
    """
    trained = config["methods"][method]["checkpoint_of"]
    where = f"{source}: methods.{method}.checkpoint_of = {trained!r}"
    if trained == method:
        raise ConfigError(
            f"{where} names the method itself; a method that trains its own checkpoint has no checkpoint_of"
        )
    if trained not in config["methods"]:
        raise ConfigError(f"{where} is not defined under 'methods'")
    if not has_training(config, trained):
        raise ConfigError(
            f"{where} has no checkpoint of its own (it is an ensemble or re-embeds another "
            "method's checkpoints); name the method that is trained"
        )
    for dataset in [None, *config.get("datasets", {})]:
        differences = training_differences(
            resolve_method(config, trained, dataset), resolve_method(config, method, dataset)
        )
        if differences:
            recipe = resolve_method(config, trained)["recipe"]
            on = f" on dataset {dataset!r}" if dataset else ""
            raise ConfigError(
                f"{where}, but {method} differs from {trained}{on} in {differences}, which change the training "
                f"(only recipe {recipe!r}'s test-time options {sorted(recipe_test_time_options(recipe))} and "
                f"{list(PRESENTATION_KEYS)} may differ): set those keys as {trained} has them, or drop "
                f"checkpoint_of so that {method} is trained itself"
            )
