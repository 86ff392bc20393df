"""Entries the parameters generate: the points of ``sweeps`` and the tuned twins of ``tuning.tables``.

:func:`expand_params` adds them after the parameter files and overlays are merged, before validation
(:func:`dmlbench.params.merge_params`). No parameter file writes a generated entry, so the workflow tracks
it by the keys that generate it (:func:`origin_keys`): Snakemake reruns its jobs when they change, and DVC
finds them in the files that set them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dmlbench.config import conforms
from dmlbench.sweeps import expand_sweeps, sweep_keys
from dmlbench.tuning.entries import expand_tuned, tuned_keys
from dmlbench.tuning.space import TUNING_KEY


def expand_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the sweeps' points, then the tuned tables and entries, added (a copy when any). The
    tuned twins are generated from valid parameters only: otherwise :func:`dmlbench.params.validate_config`
    reports what is wrong, naming the files."""
    swept = expand_sweeps(config)
    return expand_tuned(swept) if conforms(swept) else swept


def origin_keys(config: Mapping[str, Any], kind: str, name: str, exclude: Sequence[str] = ()) -> list[str]:
    """The dotted parameter keys that define ``<kind>.<name>`` (``kind``: ``methods`` or ``tables``), minus
    those whose last part is in ``exclude``: a written entry's own keys, a generated one's generating keys.

    A method's ``tuning`` never changes its runs (only the tune job reads it), so it is left out here.

    >>> config = {"methods": {"a": {"recipe": "x", "label": "A", "tuning": {}}}, "tables": {}}
    >>> origin_keys(config, "methods", "a", exclude=["label"])
    ['methods.a.recipe']
    """
    generated = sweep_keys(config, name, exclude) if kind == "methods" else None
    if generated is None:
        generated = tuned_keys(config, kind, name)
    if generated is not None:
        return generated
    ignored = {*exclude, TUNING_KEY} if kind == "methods" else set(exclude)
    return [f"{kind}.{name}.{key}" for key in config[kind][name] if key not in ignored]
