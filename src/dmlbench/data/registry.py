"""Dataset preparers, looked up by the ``kind`` of a ``datasets.<name>`` params section.

Each preparer module exposes ``prepare(config, out_dir) -> Path``: it reads
its params section ``config`` (a mapping), writes ``out_dir/manifest.csv``
(and any generated files under ``out_dir``) atomically, and returns the
manifest path. Modules are imported on first use so that preparing one
dataset never imports the parsers of the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PREPARER_MODULES: dict[str, str] = {
    "synthetic": "dmlbench.data.synthetic",
    "cub200": "dmlbench.data.cub200",
    "cars196": "dmlbench.data.cars196",
    "sop": "dmlbench.data.sop",
    "inshop": "dmlbench.data.inshop",
    "vehicleid": "dmlbench.data.vehicleid",
}


def prepare_dataset(config: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Prepare the dataset described by ``config`` (its ``kind`` picks the preparer)."""
    kind = config.get("kind")
    if kind not in PREPARER_MODULES:
        raise KeyError(
            f"datasets.*.kind = {kind!r} is not a known dataset kind; known: {sorted(PREPARER_MODULES)}"
        )
    module = importlib.import_module(PREPARER_MODULES[kind])
    return module.prepare(config, Path(out_dir))
