"""Path containment: a path that a command writes, built from a name or a listed file, stays inside
the folder it belongs to.

Every writer that joins a folder with something it did not choose itself (a dataset or method name, a
file name given on the command line, an image path read from a dataset's list file) joins them with
:func:`contained`, which refuses an absolute part or a ``..`` that leads out of the folder. The check
is on the path as written (``os.path.normpath``): a symbolic link that the user made inside the folder
(e.g. ``results/runs`` on another disk) is followed as intended.

A command with several outputs checks with :func:`distinct_outputs`, before it computes anything, that no
two of them (and no output and input) are one file, so that none overwrites another.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
        raise PathOutsideError(
            f"{path}: would be written outside {base} (it resolves to {target}); a name or a "
            f"listed path must stay inside its folder: no '..' that leads out, no absolute path"
        )
    return path


class SameFileError(DmlbenchError, ValueError):
    """Two outputs of one command, or an output and an input, are one file: one would overwrite the other."""


def _identity(path: Path) -> tuple[str, ...]:
    """What makes two paths one file: the device and inode of an existing file (hard links too), else the
    resolved path (symbolic links, ``..`` and the working folder undone)."""
    resolved = path.resolve()
    if resolved.exists():
        stat = resolved.stat()
        return ("inode", str(stat.st_dev), str(stat.st_ino))
    return ("path", str(resolved))


def distinct_outputs(
    outputs: Mapping[str, str | os.PathLike[str]], inputs: Mapping[str, str | os.PathLike[str]] | None = None
) -> None:
    """Refuse, before anything is written, outputs of one command that are one file, or an output that is one
    of its inputs.

    Args:
        outputs: ``{what the user calls it (an option, e.g. "--out"): path}``.
        inputs: the same for the files the command reads.

    Raises:
        SameFileError: naming both options, the file, and the fix.
    """
    seen: dict[tuple[str, ...], str] = {}
    for role, paths in (("input", inputs or {}), ("output", outputs)):
        for name, path in paths.items():
            key = _identity(Path(path))
            if key in seen and role == "output":
                raise SameFileError(
                    f"{name} {path}: is the same file as {seen[key]}, which it would overwrite; "
                    f"give each output its own path, different from every input"
                )
            seen.setdefault(key, f"{role} {name} {path}")
