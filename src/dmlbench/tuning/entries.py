"""The tuned twins of tables: ``tuning.tables`` → ``<table>_tuned`` with a ``<m>_tuned`` entry per trained method.

For each table ``t`` listed under ``tuning.tables``, :func:`expand_tuned` adds

- ``methods.<m>_tuned`` for every method ``m`` of ``t`` that is trained (not a reference row, an ensemble or
  a re-embedding): ``{base: m, label: <m's label>, training: {embedding_dim: E, selection: last,
  val_fraction: 0}}`` — the same total embedding size ``E`` for every method (:func:`tuned_embedding_dim`;
  an ensemble's learners split it), trained on all training classes, keeping the last epoch (there is no
  validation split left to choose one: the tuning folds chose the settings);
- ``tables.<t>_tuned``: ``t`` with those entries in place of the trained methods (reference rows and the
  other untrained rows stay), a title saying so and a caption stating the budget, folds and spaces.

The best settings of ``<m>_tuned`` on dataset ``d`` come from ``results/tuning/<d>/<m>/best.yaml``
(written by ``dmlbench tune``), a parameter overlay that sets ``methods.<m>_tuned.per_dataset.<d>``
(:func:`tuned_overlay`); the workflow passes it as one more ``--config`` to the tuned runs and the tuned
table's report. Before use, every such value is checked against the method's search space
(:func:`check_tuned_settings`): a best file edited by hand or written for another space is an error.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dmlbench.config import (
    ConfigError,
    check_section,
    has_training,
    resolve_method,
    resolve_run,
    section,
)
from dmlbench.errors import did_you_mean
from dmlbench.tuning.space import (
    TUNING_KEY,
    check_space_keys,
    check_values,
    flat_values,
    method_space,
    nested_values,
)

#: what a tuned entry's and a tuned table's names end with.
TUNED_SUFFIX = "_tuned"
#: the tuned runs' protocol: all training classes, the last epoch (the tuning folds chose the settings).
TUNED_PROTOCOL = {"selection": "last", "val_fraction": 0.0}
#: the only key a tuned entry may be given from outside (by a best.yaml overlay).
PER_DATASET = "per_dataset"


def tuned_name(name: str) -> str:
    """The tuned twin's name of a method or table.

    >>> tuned_name("margin")
    'margin_tuned'
    """
    return f"{name}{TUNED_SUFFIX}"


def tuning_settings(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``tuning`` section (schema-checked), or an empty mapping when the parameters have none."""
    check_section(config, TUNING_KEY)
    return config.get(TUNING_KEY) or {}


def is_tunable(config: Mapping[str, Any], method: str) -> bool:
    """Whether a tuned table tunes ``method``: the workflow trains it, and it is not a reference row."""
    return has_training(config, method) and resolve_method(config, method).get("recipe") != "reference"


def tuned_methods(config: Mapping[str, Any], table: str) -> dict[str, str]:
    """The trained methods of ``tables.<table>`` → their tuned entries' names, in the table's order."""
    methods = config.get("methods") or {}
    return {
        m: tuned_name(m) for m in section(config, "tables", table)["methods"] if m in methods and is_tunable(config, m)
    }  # an undefined one: validate_config names it


def tuned_embedding_dim(config: Mapping[str, Any]) -> int:
    """Every tuned method's total embedding size: ``tuning.embedding_dim``, or when it is null the training
    default ``training.embedding_dim`` (64 in params.yaml, 512 under the cub_lite and paper overlays)."""
    size = config[TUNING_KEY]["embedding_dim"]
    return int(size if size is not None else config["training"]["embedding_dim"])


def _tuned_entry(config: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The generated entry of ``<method>_tuned`` (without per-dataset best settings)."""
    training = {**TUNED_PROTOCOL, "embedding_dim": tuned_embedding_dim(config)}
    return {"base": method, "label": resolve_method(config, method).get("label", method), "training": training}


def _shown_name(item: tuple[str, Any]) -> str:
    """A space entry's name in the caption: its key's last part (``training.optimizer.lr`` → ``lr``); the
    caption lists them in this order, whatever order the (possibly re-dumped, sorted) parameters give."""
    return item[0].rsplit(".", 1)[-1]


def caption(config: Mapping[str, Any], table: str) -> str:
    """The tuned table's caption note: the budget, the folds, the score, the protocol and every space."""
    settings = config[TUNING_KEY]
    spaces = "; ".join(
        f"{resolve_method(config, m).get('label', m)}: "
        + ", ".join(
            f"{_shown_name(item)} {item[1].describe()}"
            for item in sorted(method_space(config, m).items(), key=_shown_name)
        )
        for m in tuned_methods(config, table)
    )
    size = f"embedding size {tuned_embedding_dim(config)} for every method (ensembles split it among their learners)"
    k = settings["folds"]
    return (
        f"Equal-budget tuning: every trained method had {settings['trials']} trials (Optuna TPE, seed "
        f"{settings['seed']}, the first {settings['startup_trials']} at random); a trial trains once per fold "
        f"of {k} class-disjoint folds of the training classes, on the other {k - 1}, and scores "
        f"{settings['metric']} on the held-out fold (mean over the {k} folds; the test split is never read). "
        f"Each method was then retrained with its best settings on all training classes, {size}, keeping the "
        f"last epoch; test used once. Search spaces: {spaces}."
    )


def _check_best_settings(config: Mapping[str, Any], method: str, given: Mapping[str, Any]) -> None:
    """A tuned entry given from outside holds only ``per_dataset.<d>`` settings inside ``method``'s space.

    Raises:
        ConfigError: another key, an unknown dataset, or a value outside the space (naming the key path).
    """
    where = f"methods.{tuned_name(method)}"
    extra = sorted(set(given) - {PER_DATASET})
    if extra:
        raise ConfigError(
            f"{where} is generated from tuning.tables; only a best.yaml of `dmlbench tune` may add "
            f"to it ({PER_DATASET}.<dataset>), but it sets {extra}: change methods.{method} or "
            f"tuning instead"
        )
    space = method_space(config, method)
    for dataset, settings in (given.get(PER_DATASET) or {}).items():
        if dataset not in (config.get("datasets") or {}):
            raise ConfigError(
                f"{where}.{PER_DATASET} names dataset {dataset!r}, which is not under 'datasets'"
                f"{did_you_mean(str(dataset), config.get('datasets') or {})}"
            )
        check_values(space, flat_values(settings), f"{where}.{PER_DATASET}.{dataset}")


def expand_tuned(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with the tuned entries and tables of ``tuning.tables`` added (module doc); the
    best settings a best.yaml overlay gave a tuned entry are kept, after :func:`_check_best_settings`.

    Raises:
        ConfigError: a listed table that is not defined, a generated name that is already a table, a tuned
            method without a space, or best settings outside the space.
    """
    settings = tuning_settings(config)
    if not settings.get("tables"):
        return dict(config)
    expanded = copy.deepcopy(dict(config))
    methods, tables = expanded.setdefault("methods", {}), expanded.setdefault("tables", {})
    for table in settings["tables"]:
        if table not in (config.get("tables") or {}):
            raise ConfigError(
                f"tuning.tables names {table!r}, which is not under 'tables'"
                f"{did_you_mean(table, config.get('tables') or {})}"
            )
        spec = dict(config["tables"][table])
        twins = tuned_methods(config, table)
        for method, twin in twins.items():
            entry = _tuned_entry(config, method)
            # keys equal to the generated ones: a dump of merged parameters read back changes nothing
            given = {key: value for key, value in methods.get(twin, {}).items() if entry.get(key) != value}
            _check_best_settings(config, method, given)
            methods[twin] = {**entry, **given}
        spec.update(
            title=f"{spec.get('title', table)} (equal-budget tuning)",
            methods=[twins.get(m, m) for m in spec["methods"]],
            caption=caption(expanded, table),
        )
        if tables.get(tuned_name(table), spec) != spec:
            raise ConfigError(f"tables.{tuned_name(table)} is generated from tuning.tables: rename that table")
        tables[tuned_name(table)] = spec
    return expanded


def check_tuning(config: Mapping[str, Any], source: str = "params") -> None:
    """Every key of a tuned method's space names a setting its tuned run has, on every dataset (run by
    :func:`dmlbench.params.validate_config`, after the runs' own checks).

    Raises:
        ConfigError: naming the space's key, what the run has there, and ``source``.
    """
    for table in (config.get(TUNING_KEY) or {}).get("tables") or []:
        for method, twin in tuned_methods(config, table).items():
            for dataset in config.get("datasets") or {}:
                run = resolve_run(untuned(config, twin), dataset, twin, 0)
                try:
                    check_space_keys(method_space(config, method), run, f"methods.{method}.{TUNING_KEY}.space")
                except ConfigError as err:
                    raise ConfigError(f"{source}: {err}") from err


def untuned(config: Mapping[str, Any], twin: str) -> dict[str, Any]:
    """``config`` without the best settings a best.yaml gave the tuned entry ``twin`` (what a tune job starts
    from, whatever overlays it was given)."""
    if PER_DATASET not in config["methods"][twin]:
        return dict(config)
    stripped = copy.deepcopy(dict(config))
    del stripped["methods"][twin][PER_DATASET]
    return stripped


def tuned_overlay(dataset: str, method: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The parameter overlay that gives ``<method>_tuned`` the settings ``values`` (dotted key → value) on
    ``dataset``: the content of a best.yaml.

    >>> tuned_overlay("synthetic", "margin", {"loss.margin": 0.2})
    {'methods': {'margin_tuned': {'per_dataset': {'synthetic': {'loss': {'margin': 0.2}}}}}}
    """
    return {"methods": {tuned_name(method): {PER_DATASET: {dataset: nested_values(values)}}}}


def tuned_keys(config: Mapping[str, Any], kind: str, name: str) -> list[str] | None:
    """The dotted parameter keys that define a generated tuned entry (``kind`` ``methods``) or table
    (``tables``); None for any other entry.

    A tuned entry: ``tuning.embedding_dim`` (``training``, the default size, is a key of every run; its base's
    keys come with its base). A tuned table: its
    source table, the ``tuning`` section and the spaces of its tuned methods (all in its caption).
    """
    if not name.endswith(TUNED_SUFFIX):  # the workflow asks this for every job: the names first
        return None
    for table in (config.get(TUNING_KEY) or {}).get("tables") or []:
        if kind == "tables" and name == tuned_name(table):
            return [f"tables.{table}", TUNING_KEY, *space_keys(config, list(tuned_methods(config, table)))]
        if kind == "methods" and name in tuned_methods(config, table).values():
            return [f"{TUNING_KEY}.embedding_dim"]
    return None


def space_keys(config: Mapping[str, Any], methods: Sequence[str]) -> list[str]:
    """The dotted keys of the written search spaces of ``methods`` (a sweep's point has its space, if any, in
    its sweep's ``set``, which its own keys cover)."""
    return [f"methods.{m}.{TUNING_KEY}" for m in methods if TUNING_KEY in config["methods"][m]]
