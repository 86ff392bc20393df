"""Path containment: a path that a command writes, built from a name or a listed file, stays inside
the folder it belongs to.

Every writer that joins a folder with something it did not choose itself (a dataset or method name, a
file name given on the command line, an image path read from a dataset's list file) joins them with
:func:`contained`, which refuses an absolute part or a ``..`` that leads out of the folder. The check
is on the path as written (``os.path.normpath``): a symbolic link that the user made inside the folder
(e.g. ``results/runs`` on another disk) is followed as intended.
"""

from __future__ import annotations

import os
from pathlib import Path

from dmlbench.errors import DmlbenchError


class PathOutsideError(DmlbenchError, ValueError):
    """A path to write that leads out of the folder it belongs to."""


def contained(base: str | os.PathLike[str], *parts: str | os.PathLike[str]) -> Path:
    """``base / part / …``, checked to stay inside ``base``.

    Raises:
        PathOutsideError: a part is absolute or its ``..`` components climb out of ``base``; the message
            names the path, the folder, and the fix.

    >>> contained("results/runs", "cub200", "triplet", "seed0").as_posix()
    'results/runs/cub200/triplet/seed0'
    """
    base = Path(base)
    path = base.joinpath(*parts)
    root = os.path.normpath(os.path.abspath(base))
    target = os.path.normpath(os.path.abspath(path))
    if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
        raise PathOutsideError(f"{path}: would be written outside {base} (it resolves to {target}); a name or a "
                               f"listed path must stay inside its folder: no '..' that leads out, no absolute path")
    return path
