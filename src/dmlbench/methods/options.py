"""Typed recipe options: ``methods.<name>.options`` → a frozen dataclass, unknown keys rejected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from dmlbench.errors import DmlbenchError
from dmlbench.settings import parse_dataclass

T = TypeVar("T")


class OptionsError(DmlbenchError, ValueError):
    """``methods.<name>.options`` has an unknown key or a value of the wrong type."""


def parse_options(options_class: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """Build ``options_class`` (a dataclass whose fields all have defaults) from ``values``.

    Lists become tuples (the dataclass stays hashable and immutable); the one parser of every typed section
    (:func:`dmlbench.settings.parse_dataclass`).

    Args:
        options_class: the recipe's options dataclass.
        values: the ``options`` mapping of the method (None or empty: all defaults).
        where: the params path for error messages, e.g. ``methods.abe8.options``.

    Raises:
        OptionsError: an unknown key (the message lists the known ones) or a wrong type.

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Demo:
    ...     learners: int = 8
    ...     weight: float = 1.0
    >>> parse_options(Demo, {"learners": 4}, "methods.x.options")
    Demo(learners=4, weight=1.0)
    >>> parse_options(Demo, {"lerners": 4}, "methods.x.options")
    Traceback (most recent call last):
    ...
    dmlbench.methods.options.OptionsError: methods.x.options.lerners is not an option of this recipe (did you mean 'learners'?); known: learners, weight
    """
    return parse_dataclass(options_class, values, where, error=OptionsError, what="an option of this recipe")
