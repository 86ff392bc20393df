"""The params keys that each workflow rule tracks: rule name → function(wildcards) → dotted params keys.

``workflow/rules/common.smk``'s ``tracked_params`` fills :data:`PARAM_KEYS` while Snakemake reads the
Snakefile (each rule declares its keys there, so that editing one reruns the job);
``workflow/scripts/make_dvc_yaml.py`` reads it after its dry run, so that each DVC stage declares the same
keys, without reaching into Snakemake's ``Workflow`` object (whose globals are not Snakemake's public API).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: rule name → function of the job's wildcards (attribute access: ``w.dataset``) → its dotted params keys.
PARAM_KEYS: dict[str, Callable[[Any], list[str]]] = {}
