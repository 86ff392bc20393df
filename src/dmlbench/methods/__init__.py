"""Method registry: ``methods.<name>.recipe`` → :class:`Recipe` subclass."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dmlbench.methods.base import Recipe

RECIPES: dict[str, type[Recipe]] = {
    "baseline": Recipe,
}


def build_recipe(run: Mapping[str, Any]) -> Recipe:
    """The recipe for a resolved run; unknown names list the known ones."""
    name = run["method_config"].get("recipe")
    if name not in RECIPES:
        raise KeyError(f"methods.{run['method']}.recipe = {name!r} is unknown; known: {sorted(RECIPES)}")
    return RECIPES[name](run)


__all__ = ["RECIPES", "Recipe", "build_recipe"]
