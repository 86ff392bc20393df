"""Dataset preparers, looked up by the ``kind`` of a ``datasets.<name>`` params section
(:data:`dmlbench.data.kinds.PREPARER_MODULES`).

Each preparer module exposes ``prepare(config, out_dir) -> Path``: it reads
its params section ``config`` (a mapping), writes ``out_dir/manifest.csv``
(and any generated files under ``out_dir``) atomically, and returns the
manifest path. Modules are imported on first use so that preparing one
dataset never imports the parsers of the others.

``prepare`` never deletes or overwrites what it does not own (:func:`check_out_dir`): it refuses an
output folder inside the dataset's own files, and a non-empty one without its marker file. A dataset is
atomic (:func:`dmlbench.atomic.atomic_folder`): the preparer writes into a new folder beside ``out_dir``,
under a lock on it, and that folder replaces ``out_dir`` as the last step, so an interrupted or failed
prepare leaves the old dataset whole, and two prepares of one folder run one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.atomic import atomic_folder
from dmlbench.data.kinds import PREPARER_MODULES
from dmlbench.errors import DmlbenchError

#: written into an output folder by a finished ``prepare``: the folder is dmlbench's to rewrite.
OWNER_MARKER = ".dmlbench-prepared"
#: a folder prepared before :data:`OWNER_MARKER` existed has this file (rewritten by every ``prepare``).
LEGACY_OWNED_FILE = "manifest.csv"


class OutputFolderError(DmlbenchError, ValueError):
    """An output folder that ``prepare`` must not write into: it would delete or overwrite what it does not own."""


def check_out_dir(out_dir: Path, source: Path | None) -> None:
    """Refuse an ``out_dir`` that is, or is inside, the dataset's ``source`` folder (its local copy or raw
    archives), and a non-empty ``out_dir`` that ``prepare`` did not make (no :data:`OWNER_MARKER`):
    ``prepare`` replaces ``images/`` and the manifests it finds there.

    Raises:
        OutputFolderError: naming the folder, why, and the fix.
    """
    out = out_dir.resolve()
    if source is not None and (out == source.resolve() or source.resolve() in out.parents):
        raise OutputFolderError(
            f"--out {out_dir}: is inside the dataset's own files {source}, which prepare never "
            "modifies; choose a folder outside it (default data/prepared/<dataset>)"
        )
    if out_dir.is_dir() and not (out_dir / OWNER_MARKER).is_file() and not (out_dir / LEGACY_OWNED_FILE).is_file():
        entries = sorted(path.name for path in out_dir.iterdir())
        if entries:
            raise OutputFolderError(
                f"--out {out_dir}: not empty ({len(entries)} entries, e.g. {entries[0]!r}) and "
                f"not made by dmlbench prepare (no {OWNER_MARKER}); prepare would replace what is "
                "there: choose a new or empty folder"
            )


def prepare_dataset(config: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Prepare the dataset described by ``config`` (its ``kind`` picks the preparer) into ``out_dir``,
    after :func:`check_out_dir`; the preparer writes into a new folder that replaces ``out_dir`` when it is
    complete (:func:`dmlbench.atomic.atomic_folder`), with :data:`OWNER_MARKER`.

    Returns:
        The manifest's path under ``out_dir``.
    """
    from dmlbench.data.official import DatasetConfigError, source_folder

    module = PREPARER_MODULES.lookup(config.get("kind"), key="datasets.*.kind", error=DatasetConfigError)
    out_dir = Path(out_dir)

    # your own dataset names its folder or CSV (source_path); a generated one (synthetic) has no INFO and no source
    if hasattr(module, "source_path"):
        source = module.source_path(config)
    else:
        source = source_folder(config, module.INFO) if hasattr(module, "INFO") else None
    check_out_dir(out_dir, source)
    with atomic_folder(out_dir) as build:
        manifest = module.prepare(config, build)
        (build / OWNER_MARKER).touch()
    return out_dir / manifest.relative_to(build)
