"""The project's error base class, and the "did you mean" hint that an error about a mistyped name adds.

Every error that dmlbench raises on bad input (a file, a parameter, a CLI argument) or on a run that
cannot continue (a diverged training, a weights file that does not match) derives from
:class:`DmlbenchError`; each module's own class also derives from the built-in it used before
(``ValueError``, ``RuntimeError``, ...), so existing ``except`` clauses keep working. The command
line catches it once and exits with status 2 and the message, which names the file, key or row and
the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DmlbenchError(Exception):
    """Base of the project's errors: the CLI prints the message and exits 2."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``known`` names, or ``""`` when none is close: the hint
    that an error about an unknown name adds.

    >>> did_you_mean("tripplet", ["triplet", "margin"]), did_you_mean("x", ["triplet"])
    (" (did you mean 'triplet'?)", '')
    """
    matches = difflib.get_close_matches(name, [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {matches[0]!r}?)" if matches else ""
