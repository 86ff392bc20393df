"""One registry type for the components a parameter names: recipes, losses, backbones, dataset kinds, figure kinds.

A :class:`Registry` maps a name to its entry: an object, or a lazy reference ``"module"`` /
``"module:attribute"`` that is imported on first use (and then kept), so that checking a name never imports
the module behind it. An unknown name raises :class:`UnknownNameError` with one message for every registry:
the config key, the value, the closest known name and the known names.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, TypeVar

from dmlbench.errors import DmlbenchError, did_you_mean

T = TypeVar("T")


class UnknownNameError(DmlbenchError, KeyError, ValueError):
    """A name that a registry does not hold. A ``KeyError`` and a ``ValueError``, as the registries raised
    before; its text is the message itself (a plain ``KeyError`` would show it quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(MutableMapping[str, T]):
    """Name → entry, each entry an object or a lazy ``"module[:attribute]"`` reference resolved on first use.

    Iteration follows the registration order; :meth:`names` is sorted. ``in``, :meth:`check` and
    :meth:`module_of` never import; ``registry[name]``, :meth:`lookup` and ``values()`` / ``items()`` resolve.
    Assigning a name replaces its entry (tests register a stand-in this way).

    >>> kinds = Registry("figure kind", {"plot": "math:sqrt", "table": len})
    >>> kinds["plot"](9.0), "plot" in kinds, kinds.names(), kinds.module_of("table")
    (3.0, True, ('plot', 'table'), 'builtins')
    >>> kinds.lookup("plto", key="figures.a.kind")
    Traceback (most recent call last):
    ...
    dmlbench.registry.UnknownNameError: figures.a.kind = 'plto' is unknown (did you mean 'plot'?); known: ['plot', 'table']
    """

    def __init__(self, what: str, entries: Mapping[str, T | str], *, alternative: str = "") -> None:
        """``what``: what a name is, for messages without a key (``"loss name"``); ``entries``: name → object
        or ``"module[:attribute]"``; ``alternative``: the other accepted form that messages add after the
        known names (e.g. ``"'timm:<model>' for a timm model"``)."""
        self.what = what
        self.alternative = alternative
        self._entries: dict[str, T | str] = dict(entries)
        self._resolved: dict[str, T] = {}

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def module_of(self, name: str) -> str:
        """The module that defines ``name``'s entry (a reference's module, an object's ``__module__``),
        without importing it."""
        entry = self._entries[name]
        return entry.partition(":")[0] if isinstance(entry, str) else entry.__module__

    def unknown(self, name: Any, key: str | None = None) -> str:
        """The message for an unknown ``name``, read from ``key`` (None: the message says what a name is)."""
        subject = f"{key} = {name!r} is unknown" if key else f"unknown {self.what} {name!r}"
        alternative = f", or {self.alternative}" if self.alternative else ""
        return f"{subject}{did_you_mean(str(name), self._entries)}; known: {list(self.names())}{alternative}"

    def check(self, name: Any, key: str | None = None, *, error: type[Exception] = UnknownNameError) -> str:
        """``name``, checked to be registered, without resolving its entry.

        Raises:
            error: ``name`` is not registered (:meth:`unknown` gives the message); a module's own error
                class where its callers catch that.
        """
        if not isinstance(name, str) or name not in self._entries:
            raise error(self.unknown(name, key))
        return name

    def lookup(self, name: Any, key: str | None = None, *, error: type[Exception] = UnknownNameError) -> T:
        """The entry of ``name``, resolved (imported on first use, then kept).

        Raises:
            error: as :meth:`check`.
        """
        name = self.check(name, key, error=error)
        if name not in self._resolved:
            entry = self._entries[name]
            self._resolved[name] = _resolve(entry) if isinstance(entry, str) else entry
        return self._resolved[name]

    def __getitem__(self, name: str) -> T:
        return self.lookup(name)

    def __setitem__(self, name: str, entry: T | str) -> None:
        self._entries[name] = entry
        self._resolved.pop(name, None)

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        self._resolved.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {list(self._entries)})"


def _resolve(reference: str) -> Any:
    """The object that ``"module"`` or ``"module:attribute"`` names, importing the module."""
    module, _, attribute = reference.partition(":")
    imported = importlib.import_module(module)
    return getattr(imported, attribute) if attribute else imported
