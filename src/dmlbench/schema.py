"""The JSON schema of the parameters (``params.schema.json``, shipped with the package): every key's type and
bounds, checked by :mod:`dmlbench.config`, and the one name pattern, read by :mod:`dmlbench.names`."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SCHEMA_RESOURCE = "params.schema.json"


def schema() -> dict[str, Any]:
    """The JSON schema of the parameters, parsed afresh (a caller may change its copy).

    >>> schema()["$defs"]["name"]["pattern"]
    '^[a-z0-9_]+$'
    """
    return json.loads(resources.files("dmlbench").joinpath(SCHEMA_RESOURCE).read_text())
