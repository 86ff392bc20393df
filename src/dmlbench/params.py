"""The parameters as a whole: ``params.yaml`` with its experiments files and overlays, read, merged, expanded
and validated across sections (:func:`load_config`).

:mod:`dmlbench.config` holds the pieces (the schema, merging, a method's ``base:`` chain, one run's resolved
settings); this module joins them with what the other parts of the project check: the sweeps' and tuned tables'
generated entries (:mod:`dmlbench.generated`), checkpoint reuse (:mod:`dmlbench.methods.checkpoint_reuse`),
figures, claims and tuning. The rules of the files themselves (an experiments file only adds entries; overlays
override) are described in :mod:`dmlbench.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema

from dmlbench.config import (
    EXPERIMENT_SECTIONS,
    EXPERIMENTS_KEY,
    ConfigError,
    SchemaValidator,
    check_schema,
    checkpoint_source,
    deep_merge,
    load_yaml,
    method_chain,
    resolve_method,
    resolve_run,
)
from dmlbench.errors import did_you_mean
from dmlbench.generated import expand_params
from dmlbench.methods.checkpoint_reuse import check_checkpoint_source
from dmlbench.report.claims import check_claims
from dmlbench.report.figures import check_figure
from dmlbench.schema import schema
from dmlbench.sweeps import check_written_points
from dmlbench.tuning.entries import check_tuning


def load_config(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Load ``params.yaml`` with its experiments files and the overlays (in order), merge and validate them."""
    merged = merge_params(paths)
    validate_config(merged, source=" + ".join(str(p) for p in paths))
    return merged


def merge_params(paths: Sequence[str | Path]) -> dict[str, Any]:
    """``params.yaml`` and overlays (in order), each followed by its experiments files, deep-merged, with the
    entries they generate added (sweeps' points, tuned tables: :func:`dmlbench.generated.expand_params`);
    not validated: see :func:`load_config`."""
    if not paths:
        raise ConfigError("no parameter file given (expected params.yaml and optional overlays)")
    merged: dict[str, Any] = {}
    for path in paths:
        for _, data in params_sources(path):
            merged = deep_merge(merged, data)
    return expand_params(merged)


def params_sources(path: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """A parameter file and the experiments files it lists, each ``(path, its own content)``, in merge
    order: the file itself (without ``experiments``), then its experiments files in the listed order.

    Raises:
        ConfigError: a malformed list, a missing or malformed experiments file, or an entry of
            ``methods``, ``tables``, ``figures`` or ``sweeps`` defined by two of these files, or a method that
            one writes and a sweep generates (naming both).
    """
    path = Path(path)
    data = load_yaml(path)
    listed = data.pop(EXPERIMENTS_KEY, [])
    sources = [(path, data), *((file, _load_experiments_file(file)) for file in _experiments_files(path, listed))]
    _check_unique_entries(sources)
    check_written_points(sources)
    return sources


def _experiments_files(path: Path, listed: Any) -> list[Path]:
    """The experiments files that ``path``'s ``experiments:`` lists, relative to its folder (schema-checked)."""
    validator = SchemaValidator(schema()["properties"][EXPERIMENTS_KEY])
    error = jsonschema.exceptions.best_match(validator.iter_errors(listed))
    if error is not None:
        raise ConfigError(
            f"{path}: {EXPERIMENTS_KEY}: {error.message} (a list of YAML files, relative to {path.parent})"
        )
    return [path.parent / name for name in listed]


def _load_experiments_file(path: Path) -> dict[str, Any]:
    """One experiments file: a mapping of :data:`EXPERIMENT_SECTIONS` only."""
    data = load_yaml(path)
    extra = [key for key in data if key not in EXPERIMENT_SECTIONS]
    if extra:
        raise ConfigError(
            f"{path}: an experiments file defines only {list(EXPERIMENT_SECTIONS)}; it sets "
            f"{extra}{did_you_mean(str(extra[0]), EXPERIMENT_SECTIONS)} (defaults and datasets "
            "belong in params.yaml, overrides in an overlay)"
        )
    return data


def _check_unique_entries(sources: Sequence[tuple[Path, Mapping[str, Any]]]) -> None:
    """No entry of :data:`EXPERIMENT_SECTIONS` is defined by two of ``sources`` (a parameter file and its
    experiments files): merging would silently keep the later one."""
    owners: dict[tuple[str, str], Path] = {}
    for path, data in sources:
        for name in EXPERIMENT_SECTIONS:
            for entry in data.get(name) or {}:
                first = owners.setdefault((name, entry), path)
                if first != path:
                    raise ConfigError(
                        f"{path}: {name}.{entry} is already defined in {first}; an experiments file "
                        "adds entries, it does not redefine them: rename one (an overlay, passed "
                        "after params.yaml, is the way to override an entry)"
                    )


def validate_config(config: Mapping[str, Any], source: str = "params") -> None:
    """Validate against the schema (:func:`~dmlbench.config.check_schema`) and check cross-references between
    sections: ensembles, bases, checkpoint reuse, every run's training settings, tables, figures, claims, tuning.

    Raises:
        ConfigError: naming the key path (e.g. ``methods.triplet.loss.margin``) and the problem.
    """
    check_schema(config, source)
    for name, section_ in config.get("methods", {}).items():
        if "ensemble_members" in section_:
            extra = sorted(set(section_) - {"base", "label", "ensemble_members"})
            base = section_.get("base")
            if base is None or extra:
                raise ConfigError(
                    f"{source}: methods.{name} is an ensemble (ensemble_members): it needs a 'base' "
                    f"(the member method) and may set only 'label'; it sets {extra or 'no base'}"
                )
            if any("ensemble_members" in config["methods"].get(m, {}) for m in method_chain(config, base)):
                raise ConfigError(f"{source}: methods.{name}.base = {base!r} is itself an ensemble")
    for name in config.get("methods", {}):
        method = resolve_method(config, name)
        # a reference row (recipe: reference) is not trained, so it has no loss
        needed = ("recipe",) if method.get("recipe") == "reference" else ("recipe", "loss")
        missing = [key for key in needed if key not in method]
        if missing:
            raise ConfigError(f"{source}: methods.{name} (with its bases) defines no {' or '.join(missing)}")
        unknown = sorted(set(config["methods"][name].get("per_dataset", {})) - set(config.get("datasets", {})))
        if unknown:
            raise ConfigError(f"{source}: methods.{name}.per_dataset names {unknown}, which are not under 'datasets'")
        if "loss" in method and "name" not in method["loss"]:
            raise ConfigError(f"{source}: methods.{name}.loss (with its bases) has no 'name'")
    for dataset, stage in config.get("pretraining", {}).items():
        if dataset not in config.get("datasets", {}):
            raise ConfigError(f"{source}: pretraining.{dataset} names no dataset under 'datasets'")
        if stage["method"] not in config.get("methods", {}):
            raise ConfigError(
                f"{source}: pretraining.{dataset}.method = {stage['method']!r} is not defined under 'methods'"
            )
    for name in config.get("methods", {}):
        if checkpoint_source(config, name) is not None:
            check_checkpoint_source(config, name, source)
    _check_runs(config, source)
    for table_name, table in config.get("tables", {}).items():
        for key, section in (("datasets", "datasets"), ("methods", "methods")):
            unknown = [name for name in table[key] if name not in config[section]]
            if unknown:
                raise ConfigError(
                    f"{source}: tables.{table_name}.{key} names {unknown}, which are not defined under "
                    f"'{section}'{did_you_mean(unknown[0], config[section])} (defined: {sorted(config[section])})"
                )
    for figure_name in config.get("figures", {}):
        check_figure(config, figure_name, source)
    check_claims(config, source)
    check_tuning(config, source)


def _check_runs(config: Mapping[str, Any], source: str) -> None:
    """:func:`check_run_training` (through :func:`resolve_run`) for every method on every dataset: a run that no
    table plans today is one overlay away, and its settings are wrong already."""
    for method in config.get("methods", {}):
        for dataset in config.get("datasets", {}):
            try:
                resolve_run(config, dataset, method, 0)
            except ConfigError as err:
                raise ConfigError(f"{source}: {err}") from err
