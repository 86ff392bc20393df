"""The dataset kinds: ``datasets.<name>.kind`` → the module that prepares it (and, for an official dataset, lists
its archives). Read by :mod:`dmlbench.data.registry` (prepare) and :mod:`dmlbench.data.download` (download);
the modules are imported on first use, so preparing one dataset never imports the parsers of the others.
"""

from __future__ import annotations

from types import ModuleType

from dmlbench.registry import Registry

PREPARER_MODULES: Registry[ModuleType] = Registry(
    "dataset kind",
    {
        "synthetic": "dmlbench.data.synthetic",
        "cub200": "dmlbench.data.cub200",
        "cars196": "dmlbench.data.cars196",
        "sop": "dmlbench.data.sop",
        "inshop": "dmlbench.data.inshop",
        "vehicleid": "dmlbench.data.vehicleid",
        # your own images: an image folder root/<class>/<image>, or a CSV path,label[,split] (docs/datasets.md)
        "folder": "dmlbench.data.byo",
        "manifest": "dmlbench.data.byo",
    },
)
