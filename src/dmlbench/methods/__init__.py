"""Method registry: ``methods.<name>.recipe`` → :class:`Recipe` subclass (imported on first use).

Importing this package imports no torch (checking the parameters needs only :data:`RECIPES` and
:func:`recipe_test_time_options`); :class:`Recipe` and :class:`TrainContext` come from :mod:`.base` on
first use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dmlbench.methods.options import OptionsError, parse_options
from dmlbench.registry import Registry

if TYPE_CHECKING:
    from dmlbench.methods.base import Recipe, TrainContext

#: recipe name → its class, given as ``module:class``: a recipe module is imported only when a run uses it.
RECIPES: Registry[type[Recipe]] = Registry(
    "recipe",
    {
        "baseline": "dmlbench.methods.base:Recipe",
        "abe": "dmlbench.methods.abe:ABERecipe",
        "mpn": "dmlbench.methods.mpn:MPNRecipe",
        "deml": "dmlbench.methods.deml:DeMLRecipe",
        "diablo": "dmlbench.methods.diablo:DIABLORecipe",
        "dnc": "dmlbench.methods.dnc:DivideAndConquerRecipe",
        "reference": "dmlbench.methods.reference:ReferenceRecipe",
    },
)

#: recipe name → its ``TEST_TIME_OPTIONS`` (the options that change only how a trained model embeds), stated
#: here so that validating the parameters imports no recipe module; each class reads its entry (none: no such
#: options).
RECIPE_TEST_TIME_OPTIONS: dict[str, frozenset[str]] = {
    "mpn": frozenset(
        {
            "test_embedding",
            "test_batches",
            "rknn_k",
            "rknn_alpha",
            "test_batch_size",
            "test_chunk_size",
            "test_chunks_per_batch",
            "kmeans_images_per_cluster",
            "test_seed",
        }
    ),
}


def __getattr__(name: str) -> Any:
    """:class:`Recipe` and :class:`TrainContext`, imported from :mod:`.base` (and torch) on first use."""
    if name in ("Recipe", "TrainContext"):
        from dmlbench.methods import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def recipe_test_time_options(name: str) -> frozenset[str]:
    """``recipe_class(name).TEST_TIME_OPTIONS`` without importing the recipe; unknown names list the known ones."""
    return RECIPE_TEST_TIME_OPTIONS.get(RECIPES.check(name), frozenset())


def recipe_class(name: str) -> type[Recipe]:
    """The :class:`Recipe` subclass registered as ``name``; unknown names list the known ones."""
    return RECIPES.lookup(name)


def build_recipe(run: Mapping[str, Any]) -> Recipe:
    """The recipe for a resolved run; unknown names list the known ones."""
    return RECIPES.lookup(run["method_config"].get("recipe"), key=f"methods.{run['method']}.recipe")(run)


__all__ = [
    "RECIPES",
    "RECIPE_TEST_TIME_OPTIONS",
    "OptionsError",
    "Recipe",
    "TrainContext",
    "build_recipe",
    "parse_options",
    "recipe_class",
    "recipe_test_time_options",
]
