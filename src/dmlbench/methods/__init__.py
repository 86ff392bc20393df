"""Method registry: ``methods.<name>.recipe`` → :class:`Recipe` subclass (imported on first use)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from dmlbench.methods.base import Recipe, TrainContext
from dmlbench.methods.options import OptionsError, parse_options

#: recipe name → ``module:class``; a recipe module is imported only when a run uses it.
RECIPES: dict[str, str] = {
    "baseline": "dmlbench.methods.base:Recipe",
    "abe": "dmlbench.methods.abe:ABERecipe",
    "mpn": "dmlbench.methods.mpn:MPNRecipe",
    "deml": "dmlbench.methods.deml:DeMLRecipe",
    "diablo": "dmlbench.methods.diablo:DIABLORecipe",
    "dnc": "dmlbench.methods.dnc:DivideAndConquerRecipe",
    "reference": "dmlbench.methods.reference:ReferenceRecipe",
}


def recipe_class(name: str) -> type[Recipe]:
    """The :class:`Recipe` subclass registered as ``name``; unknown names list the known ones."""
    if name not in RECIPES:
        raise KeyError(f"recipe {name!r} is unknown; known: {sorted(RECIPES)}")
    module, _, cls = RECIPES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_recipe(run: Mapping[str, Any]) -> Recipe:
    """The recipe for a resolved run; unknown names list the known ones."""
    name = run["method_config"].get("recipe")
    if name not in RECIPES:
        raise KeyError(f"methods.{run['method']}.recipe = {name!r} is unknown; known: {sorted(RECIPES)}")
    return recipe_class(name)(run)


__all__ = ["RECIPES", "OptionsError", "Recipe", "TrainContext", "build_recipe", "parse_options", "recipe_class"]
