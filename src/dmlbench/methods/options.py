"""Typed recipe options: ``methods.<name>.options`` → a frozen dataclass, unknown keys rejected."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from dmlbench.errors import DmlbenchError

T = TypeVar("T")


class OptionsError(DmlbenchError, ValueError):
    """``methods.<name>.options`` has an unknown key or a value of the wrong type."""


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits a simple annotation (int, float, bool, str, tuple/list, Literal, Optional)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (tuple, list):
        args = typing.get_args(annotation)
        if not isinstance(value, list | tuple):
            return False
        item = args[0] if args else Any
        return all(_matches(v, item) for v in value)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def parse_options(options_class: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """Build ``options_class`` (a dataclass whose fields all have defaults) from ``values``.

    Lists become tuples (the dataclass stays hashable and immutable).

    Args:
        options_class: the recipe's options dataclass.
        values: the ``options`` mapping of the method (None or empty: all defaults).
        where: the params path for error messages, e.g. ``methods.abe8.options``.

    Raises:
        OptionsError: an unknown key (the message lists the known ones) or a wrong type.

    >>> @dataclasses.dataclass(frozen=True)
    ... class Demo:
    ...     learners: int = 8
    ...     weight: float = 1.0
    >>> parse_options(Demo, {"learners": 4}, "methods.x.options")
    Demo(learners=4, weight=1.0)
    >>> parse_options(Demo, {"lerners": 4}, "methods.x.options")
    Traceback (most recent call last):
    ...
    dmlbench.methods.options.OptionsError: methods.x.options.lerners is not an option of this recipe; known: learners, weight
    """
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(options_class)}
    hints = typing.get_type_hints(options_class)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise OptionsError(f"{where}.{unknown[0]} is not an option of this recipe; known: {', '.join(fields)}")
    for key, value in values.items():
        if not _matches(value, hints[key]):
            raise OptionsError(f"{where}.{key} = {value!r} does not have the expected type {hints[key]}")
        if isinstance(value, list):
            values[key] = tuple(value)
    try:
        return options_class(**values)
    except (TypeError, ValueError) as err:
        raise OptionsError(f"{where}: {err}") from err
