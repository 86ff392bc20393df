"""Where each effective setting of a run comes from: the parameter file and line that set it.

A run's settings pass through several layers (:mod:`dmlbench.config`): ``params.yaml`` and its experiments
files, the overlays (each with its experiments files), the command line's ``KEY=VALUE`` overrides, then
:func:`~dmlbench.config.resolve_run`'s precedence (``training`` ← ``datasets.<d>.training`` ← each method of
the ``base:`` chain with its ``per_dataset.<d>``). Nothing of this is tracked while the parameters load, so
:func:`~dmlbench.params.load_config` costs what it did: the sources are found afterwards, on request
(``dmlbench show``), in two steps that follow the merge rules (mappings merge key by key, anything else
replaces):

1. :func:`parameter_of`: the parameter (dotted key of the merged configuration) that sets a leaf of the
   resolved run — the first of its candidates, in precedence order, that defines it;
2. :meth:`Layers.where`: the file (and line) that sets that parameter — the last layer that defines it.

A leaf is a value that is not a non-empty mapping (a list is one leaf: it is replaced as a whole).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dmlbench.config import ConfigError, _UniqueKeyLoader, deep_merge, method_chain
from dmlbench.params import params_sources

#: the name of the layer made of ``KEY=VALUE`` overrides given on the command line.
COMMAND_LINE = "command line"
#: how :func:`dmlbench.workflow_checks.overrides_overlay` names the overlay that holds Snakemake's ``--config``.
SNAKEMAKE_OVERRIDES_PREFIX = "config_overrides-"
#: the sections of a resolved run that come from the parameters, as :func:`~dmlbench.config.resolve_run` names them.
RUN_SECTIONS = ("dataset_config", "method_config", "training", "evaluation")

Path_ = tuple[str, ...]


def key_lines(path: str | Path) -> dict[Path_, int]:
    """The line (1-based) of every key of a YAML file, by key path (``("training", "optimizer", "lr")``).
    Read with the loader of :func:`~dmlbench.config.load_yaml` (call that first: it reports a broken file)."""
    with open(path, encoding="utf-8") as stream:
        loader = _UniqueKeyLoader(stream)
        try:
            root = loader.get_single_node()
            lines: dict[Path_, int] = {}

            def walk(node: yaml.Node | None, prefix: Path_) -> None:
                if not isinstance(node, yaml.MappingNode):
                    return
                for key_node, value_node in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys stay at the anchor
                        continue
                    key = (*prefix, str(loader.construct_object(key_node, deep=True)))
                    lines.setdefault(key, key_node.start_mark.line + 1)
                    walk(value_node, key)

            walk(root, ())
        finally:
            loader.dispose()
    return lines


def defines(data: Any, path: Sequence[str]) -> bool:
    """Whether the nested mapping ``data`` has the key path ``path`` (a tuple, unlike
    :func:`dmlbench.config.defines`, so a key may hold a dot)."""
    for part in path:
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def value_at(data: Any, path: Sequence[str]) -> Any:
    for part in path:
        data = data[part]
    return data


def leaves(node: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """``(key path, value)`` of every leaf of a nested mapping, in its order."""
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from leaves(value, (*prefix, str(key)))
    else:
        yield prefix, node


def shown_path(path: str | Path) -> str:
    """A file as the user reads it: relative to the working folder when it lies inside, else as given."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def _layer_name(path: Path) -> str:
    if path.name.startswith(SNAKEMAKE_OVERRIDES_PREFIX):
        return f"{COMMAND_LINE} (snakemake --config, written to {shown_path(path)})"
    return shown_path(path)


@dataclass(frozen=True)
class Layer:
    """One parameter file's own content (or the command line's overrides) and the line of each of its keys."""

    name: str
    data: Mapping[str, Any]
    lines: Mapping[Path_, int]

    def where(self, path: Path_) -> str:
        line = self.lines.get(path)
        return f"{self.name}:{line}" if line else self.name


class Layers:
    """The layers of a configuration in merge order (later wins)."""

    def __init__(self, layers: Sequence[Layer]):
        self.layers = list(layers)

    @classmethod
    def read(cls, paths: Sequence[str | Path], overrides: Mapping[str, Any] | None = None) -> Layers:
        """``paths`` (``params.yaml`` and overlays), each followed by its experiments files
        (:func:`~dmlbench.params.params_sources`), then ``overrides`` (:data:`COMMAND_LINE`)."""
        if not paths:
            raise ConfigError("no parameter file given (expected params.yaml and optional overlays)")
        layers = [
            Layer(_layer_name(file), data, key_lines(file)) for path in paths for file, data in params_sources(path)
        ]
        if overrides:
            layers.append(Layer(COMMAND_LINE, overrides, {}))
        return cls(layers)

    def merged(self) -> dict[str, Any]:
        """The layers deep-merged, overrides last, with the entries they generate added: what
        :func:`~dmlbench.params.merge_params` gives for the files and an overlay of the overrides."""
        merged: dict[str, Any] = {}
        for layer in self.layers:
            merged = deep_merge(merged, layer.data)
        return _expanded(merged)

    def defining(self, path: Path_) -> Layer | None:
        """The layer that sets ``path`` in the merged configuration: the last that defines it. (A later layer
        that replaced a parent with a non-mapping would have removed the key; one that merged a mapping
        into the parent without the key left it as it was.)"""
        return next((layer for layer in reversed(self.layers) if defines(layer.data, path)), None)

    def where(self, path: Path_) -> str:
        layer = self.defining(path)
        return layer.where(path) if layer else "?"


def _expanded(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its generated entries (sweeps' points, tuned twins) added, as ``merge_params`` adds them."""
    try:
        from dmlbench.generated import expand_params
    except ImportError:  # a project without generated entries
        return config
    return expand_params(config)


def generated_from(config: Mapping[str, Any], layers: Layers, parameter: Path_) -> str:
    """Where a parameter that no file writes comes from: the keys that generate its entry (a sweep's point, a
    tuned twin: :func:`dmlbench.generated.origin_keys`) and where they are set."""
    try:
        from dmlbench.generated import origin_keys

        keys = origin_keys(config, parameter[0], parameter[1]) if parameter[0] in ("methods", "tables") else []
    except (ImportError, KeyError, TypeError, ValueError, IndexError):
        keys = []
    if not keys:
        return "generated (no parameter file writes it)"
    entries = dict.fromkeys(tuple(key.split(".")[:2]) for key in keys)  # e.g. sweeps.dnc_k
    return "generated by " + ", ".join(f"{'.'.join(entry)} ({layers.where(entry)})" for entry in entries)


def parameter_candidates(config: Mapping[str, Any], path: Path_, method: str, dataset: str | None) -> list[Path_]:
    """The parameters that may set the leaf ``path`` of a resolved run (or, with ``dataset`` None and ``path``
    under ``method_config``, of a resolved method), highest precedence first (:func:`resolve_run`,
    :func:`resolve_method`)."""
    section, rest = path[0], path[1:]
    chain = method_chain(config, method)

    def of_methods(*inner: str) -> list[Path_]:
        return [
            candidate
            for name in chain
            for candidate in (
                *([("methods", name, "per_dataset", dataset, *inner, *rest)] if dataset is not None else []),
                ("methods", name, *inner, *rest),
            )
        ]

    if section == "training":
        return [
            *of_methods("training"),
            *([("datasets", dataset, "training", *rest)] if dataset else []),
            ("training", *rest),
        ]
    if section == "method_config":
        return of_methods()
    if section == "dataset_config" and dataset is not None:
        return [("datasets", dataset, *rest)]
    if section == "evaluation":
        return [("evaluation", *rest)]
    return []


def parameter_of(config: Mapping[str, Any], path: Path_, method: str, dataset: str | None) -> Path_ | None:
    """The parameter that sets the leaf ``path`` of the resolved run: the first candidate
    (:func:`parameter_candidates`) that the merged ``config`` defines; None for what the run's arguments set
    (``dataset``, ``method``, ``seed``)."""
    return next(
        (candidate for candidate in parameter_candidates(config, path, method, dataset) if defines(config, candidate)),
        None,
    )


@dataclass(frozen=True)
class Setting:
    """One effective setting: its key path in the resolved run, its value, the parameter that set it
    (dotted; empty for a run argument or a default in code) and where that is (``file:line``)."""

    path: Path_
    value: Any
    parameter: str
    source: str

    @property
    def key(self) -> str:
        return ".".join(self.path)


def run_settings(layers: Layers, config: Mapping[str, Any], run: Mapping[str, Any]) -> list[Setting]:
    """Every leaf of the resolved ``run`` (:func:`~dmlbench.config.resolve_run` of the merged ``config``) with
    its parameter and source."""
    settings = []
    for path, value in leaves(run):
        if path[0] not in RUN_SECTIONS:
            settings.append(Setting(path, value, "", f"the run's --{path[0]}"))
            continue
        parameter = parameter_of(config, path, run["method"], run["dataset"])
        settings.append(_setting(layers, config, path, value, parameter))
    return settings


def method_settings(
    layers: Layers, config: Mapping[str, Any], method: str, resolved: Mapping[str, Any], dataset: str | None = None
) -> list[Setting]:
    """Every leaf of a resolved method section (:func:`~dmlbench.config.resolve_method`) with its source."""
    return [
        _setting(layers, config, path, value, parameter_of(config, ("method_config", *path), method, dataset))
        for path, value in leaves(resolved)
    ]


def _setting(layers: Layers, config: Mapping[str, Any], path: Path_, value: Any, parameter: Path_ | None) -> Setting:
    if parameter is None or value_at(config, parameter) != value:  # the merge rules and resolve_run disagree
        raise AssertionError(f"no parameter sets {'.'.join(path)} = {value!r} (found {parameter})")
    layer = layers.defining(parameter)
    if layer is None or value_at(layer.data, parameter) != value:  # an entry the parameters generate
        return Setting(path, value, ".".join(parameter), generated_from(config, layers, parameter))
    return Setting(path, value, ".".join(parameter), layer.where(parameter))


def flow(value: Any) -> str:
    """A value as YAML writes it on one line (``null``, ``true``, ``1.0e-05``, ``[0.25, 1.0]``, ``avg``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True, sort_keys=False)
    return text.strip().removesuffix("\n...").strip()


def format_settings(settings: Sequence[Setting]) -> str:
    """One line per setting: ``key = value  # source  parameter``, the comments aligned."""
    rows = [(f"{setting.key} = {flow(setting.value)}", setting) for setting in settings]
    width = max((len(text) for text, _ in rows), default=0)
    return "".join(
        f"{text:<{width}}  # {setting.source}{'  ' + setting.parameter if setting.parameter else ''}\n"
        for text, setting in rows
    )
