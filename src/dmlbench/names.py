"""The one name pattern: every name the parameters define or a command takes.

A dataset, method, table, figure, pretraining stage or claim name becomes a file name
(``results/runs/<dataset>/<method>/…``), a Snakemake wildcard (a regular expression) and a word of a
job's shell command. So it is restricted to lower-case letters, digits and ``_`` — one pattern, the
schema's ``$defs/name`` (read from there, so the schema, the workflow's wildcard constraints and the
command line cannot drift apart):

- the schema checks every named section's keys with it (:func:`dmlbench.config.check_schema`);
- the workflow's wildcards accept only the names the parameters define (:func:`one_of`), so a target
  such as ``data/raw/cub200/x$(touch PWNED)`` matches no rule;
- the command line's name arguments are checked by :func:`name_argument`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from typing import TypeGuard

from dmlbench.errors import DmlbenchError
from dmlbench.schema import schema

#: the schema's definition of a name (``$defs/name``).
NAME_DEFINITION = "name"
#: what a name may contain, in words (for error messages).
NAME_RULE = "lower-case letters a-z, digits 0-9 and _"


class BadNameError(DmlbenchError, ValueError):
    """A name that does not match the name pattern."""


def _schema_name_pattern() -> str:
    """The anchored pattern of ``$defs/name`` in the schema (``^…$``, JSON schema's dialect)."""
    return schema()["$defs"][NAME_DEFINITION]["pattern"]


#: the schema's pattern, anchored (``^[a-z0-9_]+$``).
NAME_PATTERN = _schema_name_pattern()
#: the same pattern unanchored: a whole name is ``re.fullmatch(NAME_REGEX, text)`` (Python's ``$`` would
#: also match before a final newline, so ``^…$`` is never used with ``re.match``/``re.search`` here).
NAME_REGEX = NAME_PATTERN.removeprefix("^").removesuffix("$")


def is_name(text: object) -> TypeGuard[str]:
    """Whether ``text`` is a valid name (a string matching the pattern as a whole: no newline, no ``/``)."""
    return isinstance(text, str) and re.fullmatch(NAME_REGEX, text) is not None


def bad_name_message(text: object, what: str = "name") -> str:
    """The one-line error for an invalid name: the value, what it names, and what is allowed."""
    return (
        f"{text!r} is not a valid {what}: use only {NAME_RULE} (a name becomes a file name, a "
        f"Snakemake wildcard and a shell word)"
    )


def check_name(text: object, what: str) -> str:
    """``text`` when it is a valid name.

    Raises:
        BadNameError: naming the value, ``what`` it names (e.g. ``"table name"``) and the allowed characters.
    """
    if not is_name(text):
        raise BadNameError(bad_name_message(text, what))
    return text


def name_argument(what: str) -> Callable[[str], str]:
    """An argparse ``type`` accepting a valid name; ``what`` says what it names (``"dataset name"``)."""

    def parse(text: str) -> str:
        if not is_name(text):
            raise argparse.ArgumentTypeError(bad_name_message(text, what))
        return text

    return parse


def one_of(names: Iterable[str]) -> str:
    """A regular expression matching exactly one of ``names`` (each ``re.escape``-d), as a Snakemake
    wildcard constraint; it matches nothing when ``names`` is empty.

    >>> one_of(["cub200", "sop"]), one_of([])
    ('(?:cub200|sop)', '(?!)')
    """
    escaped = [re.escape(name) for name in names]
    return f"(?:{'|'.join(escaped)})" if escaped else "(?!)"
