"""Parameters: ``params.yaml`` plus overlays, validated by a JSON schema.

``params.yaml`` is the configuration of both Snakemake and DVC. Overlays
(``--configfile`` in Snakemake, ``--config`` here) are deep-merged on top of it
in order: mappings merge key by key, everything else (lists included) is
replaced.

A *run* is (dataset, method, seed). Its training settings are resolved as
``training`` ← ``datasets.<d>.training`` ← ``methods.<m>.training`` (later
wins), so a method section only states what differs from the defaults.

A method may derive from another with ``base: <method>``: its section is
deep-merged over the (resolved) base section, so an ablation states only what
it changes (e.g. ``abe8_nodiv: {base: abe8, options: {divergence_weight: 0}}``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_RESOURCE = "params.schema.json"


class ConfigError(ValueError):
    """The parameters are missing, malformed or inconsistent."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested mappings merge, the rest is replaced.

    >>> deep_merge({"a": {"x": 1, "y": 2}, "b": [1]}, {"a": {"y": 3}, "b": [2]})
    {'a': {'x': 1, 'y': 3}, 'b': [2]}
    """
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read one YAML mapping; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: parameter file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return dict(data)


def schema() -> dict[str, Any]:
    """The JSON schema of the parameters (shipped with the package)."""
    return json.loads(resources.files("dmlbench").joinpath(SCHEMA_RESOURCE).read_text())


def validate_config(config: Mapping[str, Any], source: str = "params") -> None:
    """Validate against the schema and check cross-references between sections.

    Raises:
        ConfigError: naming the key path (e.g. ``methods.triplet.loss.margin``) and the problem.
    """
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  {'.'.join(str(p) for p in err.absolute_path) or '<top>'}: {err.message}" for err in errors[:10]]
        raise ConfigError(f"{source}: invalid parameters:\n" + "\n".join(lines))
    for name, section_ in config.get("methods", {}).items():
        if "ensemble_members" in section_:
            extra = sorted(set(section_) - {"base", "label", "ensemble_members"})
            base = section_.get("base")
            if base is None or extra:
                raise ConfigError(f"{source}: methods.{name} is an ensemble (ensemble_members): it needs a 'base' "
                                  f"(the member method) and may set only 'label'; it sets {extra or 'no base'}")
            if any("ensemble_members" in config["methods"].get(m, {}) for m in method_chain(config, base)):
                raise ConfigError(f"{source}: methods.{name}.base = {base!r} is itself an ensemble")
    for name in config.get("methods", {}):
        method = resolve_method(config, name)
        missing = [key for key in ("recipe", "loss") if key not in method]
        if missing:
            raise ConfigError(f"{source}: methods.{name} (with its bases) defines no {' or '.join(missing)}")
        unknown = sorted(set(config["methods"][name].get("per_dataset", {})) - set(config.get("datasets", {})))
        if unknown:
            raise ConfigError(f"{source}: methods.{name}.per_dataset names {unknown}, which are not under 'datasets'")
        if "name" not in method["loss"]:
            raise ConfigError(f"{source}: methods.{name}.loss (with its bases) has no 'name'")
    for table_name, table in config.get("tables", {}).items():
        for key, section in (("datasets", "datasets"), ("methods", "methods")):
            unknown = [name for name in table[key] if name not in config[section]]
            if unknown:
                raise ConfigError(
                    f"{source}: tables.{table_name}.{key} names {unknown}, which are not defined under "
                    f"'{section}' (defined: {sorted(config[section])})"
                )
    for figure_name in config.get("figures", {}):
        from dmlbench.report.figures import check_figure

        check_figure(config, figure_name, source)
    from dmlbench.report.claims import check_claims

    check_claims(config, source)


def load_config(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Load ``params.yaml`` and overlays (in order), merge and validate them."""
    if not paths:
        raise ConfigError("no parameter file given (expected params.yaml and optional overlays)")
    merged: dict[str, Any] = {}
    for path in paths:
        merged = deep_merge(merged, load_yaml(path))
    validate_config(merged, source=" + ".join(str(p) for p in paths))
    return merged


def section(config: Mapping[str, Any], *keys: str) -> Any:
    """``config[k1][k2]...`` with an error that names the missing key path."""
    node: Any = config
    for depth, key in enumerate(keys):
        if not isinstance(node, Mapping) or key not in node:
            raise ConfigError(f"parameter '{'.'.join(keys[: depth + 1])}' is not defined")
        node = node[key]
    return node


def method_chain(config: Mapping[str, Any], method: str) -> list[str]:
    """``[method, its base, the base's base, ...]``.

    Raises:
        ConfigError: an unknown method or base, or a cycle of bases.

    >>> method_chain({"methods": {"a": {}, "b": {"base": "a"}, "c": {"base": "b"}}}, "c")
    ['c', 'b', 'a']
    """
    chain = [method]
    node = section(config, "methods", method)
    while "base" in node:
        base = node["base"]
        if base in chain:
            raise ConfigError(f"methods.{chain[-1]}.base = {base!r} makes a cycle: {' -> '.join([*chain, base])}")
        if base not in config["methods"]:
            raise ConfigError(f"methods.{chain[-1]}.base = {base!r} is not defined under 'methods'")
        chain.append(base)
        node = config["methods"][base]
    return chain


def resolve_method(config: Mapping[str, Any], method: str, dataset: str | None = None) -> dict[str, Any]:
    """The method section merged over its bases (``base`` and ``per_dataset`` removed).

    With ``dataset``, each section's ``per_dataset.<dataset>`` is merged right after that section,
    so a derived method's own settings still win over its base's per-dataset ones (an ablation
    ``{base: mpn, options: {heads: 8}}`` keeps 8 heads on every dataset).

    >>> methods = {"a": {"recipe": "abe", "options": {"m": 8, "w": 1}}, "b": {"base": "a", "options": {"w": 0}}}
    >>> resolve_method({"methods": methods}, "b")
    {'recipe': 'abe', 'options': {'m': 8, 'w': 0}}
    >>> methods["a"]["per_dataset"] = {"cub": {"options": {"m": 2, "w": 5}}}
    >>> resolve_method({"methods": methods}, "b", "cub")
    {'recipe': 'abe', 'options': {'m': 2, 'w': 0}}
    """
    merged: dict[str, Any] = {}
    for name in reversed(method_chain(config, method)):
        node = dict(config["methods"][name])
        per_dataset = node.pop("per_dataset", {})
        merged = deep_merge(merged, node)
        if dataset is not None:
            merged = deep_merge(merged, per_dataset.get(dataset, {}))
    merged.pop("base", None)
    return merged


def ensemble_spec(config: Mapping[str, Any], method: str) -> tuple[str, int] | None:
    """``(member method, E)`` of an ensemble method (``ensemble_members: E``), None for a trained method.

    An ensemble is not trained: its seed s concatenates the test embeddings of the member method's
    runs with seeds s·E … s·E + E − 1 (:func:`dmlbench.evaluation.ensemble.member_seeds`).
    """
    node = section(config, "methods", method)
    return (node["base"], int(node["ensemble_members"])) if "ensemble_members" in node else None


def resolve_run(config: Mapping[str, Any], dataset: str, method: str, seed: int) -> dict[str, Any]:
    """Everything one run needs, self-contained (stored in its checkpoint).

    Returns:
        ``{"dataset": name, "dataset_config": ..., "method": name, "method_config": ...,
        "training": merged training settings, "evaluation": ..., "seed": seed}``.

    Precedence: ``training`` ← ``datasets.<d>.training`` ← the method's ``training`` with its
    ``per_dataset.<d>.training`` (see :func:`resolve_method`); later wins.
    """
    dataset_config = section(config, "datasets", dataset)
    method_config = resolve_method(config, method, dataset)
    training = deep_merge(section(config, "training"), dataset_config.get("training", {}))
    training = deep_merge(training, method_config.get("training", {}))
    return {
        "dataset": dataset,
        "dataset_config": {k: v for k, v in dataset_config.items() if k != "training"},
        "method": method,
        "method_config": {k: v for k, v in method_config.items() if k != "training"},
        "training": training,
        "evaluation": dict(section(config, "evaluation")),
        "seed": int(seed),
    }
