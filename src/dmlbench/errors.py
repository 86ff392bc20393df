"""The project's error base class.

Every error that dmlbench raises on bad input (a file, a parameter, a CLI argument) or on a run that
cannot continue (a diverged training, a weights file that does not match) derives from
:class:`DmlbenchError`; each module's own class also derives from the built-in it used before
(``ValueError``, ``RuntimeError``, ...), so existing ``except`` clauses keep working. The command
line catches it once and exits with status 2 and the message, which names the file, key or row and
the fix.
"""

from __future__ import annotations


class DmlbenchError(Exception):
    """Base of the project's errors: the CLI prints the message and exits 2."""
