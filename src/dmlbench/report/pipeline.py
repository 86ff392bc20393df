"""From params to a report: the table spec, caption settings and run directories of ``tables.<name>``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.config import ensemble_spec, logs_epochs, resolve_method, resolve_run, section
from dmlbench.methods import build_recipe
from dmlbench.methods.health import HealthCheck, init_parity_check

from .build import Report, build_report
from .caption import merge_settings
from .collect import RunDir
from .spec import TableSpec
from .styles import Styles, reference_methods

#: ``training.selection`` → the caption's protocol name.
PROTOCOL_OF_SELECTION = {"val": "clean", "test": "paper", "last": "last"}


#: In a table's ``metrics``, the dataset's own Recall@K set (``datasets.<d>.recall_ks``: R@1, R@2, ...).
RECALL_SET = "R@K"
#: The columns of a table that names no ``metrics``: each dataset's Recall@K set and NMI.
DEFAULT_METRICS = (RECALL_SET, "NMI")


def table_metrics(config: Mapping[str, Any], table: str, dataset: str) -> list[str]:
    """The metric columns of ``dataset`` in ``tables.<table>``: its ``metrics`` (default
    :data:`DEFAULT_METRICS`), with :data:`RECALL_SET` replaced by the dataset's R@K keys.

    >>> config = {"datasets": {"d": {"recall_ks": [1, 10]}}, "tables": {"t": {"metrics": ["R@K", "MAP@R"]}}}
    >>> table_metrics(config, "t", "d")
    ['R@1', 'R@10', 'MAP@R']
    """
    metrics: list[str] = []
    for metric in section(config, "tables", table).get("metrics") or DEFAULT_METRICS:
        if metric == RECALL_SET:
            metrics += [f"R@{k}" for k in config["datasets"][dataset]["recall_ks"]]
        else:
            metrics.append(metric)
    return metrics


def table_spec(config: Mapping[str, Any], table: str) -> TableSpec:
    """Rows, columns and labels of ``tables.<table>``; each dataset shows the table's ``metrics``
    (:func:`table_metrics`: by default its Recall@K set and NMI). Its reference rows and the project's styles of its
    methods go with it, so its plots draw each method as every other plot of the project does (:mod:`.styles`)."""
    spec = section(config, "tables", table)
    datasets, methods = spec["datasets"], spec["methods"]
    styles = Styles.from_config(config)
    metrics = {d: table_metrics(config, table, d) for d in datasets}
    return TableSpec(
        datasets=list(datasets),
        methods=list(methods),
        metrics=metrics,
        dataset_labels={d: config["datasets"][d].get("label", d) for d in datasets},
        method_labels={m: resolve_method(config, m).get("label", m) for m in methods},
        references=[m for m in reference_methods(config) if m in methods],
        method_styles={m: styles[m] for m in methods},
    )


def run_settings(run: Mapping[str, Any], seeds: list[int], dataset_label: str) -> dict[str, Any]:
    """Caption settings of one resolved run."""
    training = run["training"]
    backbone = training["backbone"]
    return {
        "protocol": PROTOCOL_OF_SELECTION[training["selection"]],
        "backbone": backbone["name"],
        "pretrained": backbone.get("pretrained") or False,
        "embedding_dim": training["embedding_dim"],
        "image_size": (training["image"]["train_crop"], training["image"]["test_crop"]),
        "epochs": training["epochs"],
        "seeds": list(seeds),
        "datasets": [dataset_label],
        "deterministic": training["deterministic"] or training["device"] == "cpu",
    }


def health_checks(config: Mapping[str, Any], dataset: str, method: str, seed: int) -> list[HealthCheck]:
    """The mechanism-health checks of a method's runs on a dataset (its recipe's, for its options);
    none for an ensemble of trained runs (its members' runs carry them)."""
    if ensemble_spec(config, method) is not None:
        return []
    run = resolve_run(config, dataset, method, seed)
    training = run["training"]
    parity = [init_parity_check()] if training["epochs"] > 0 and training.get("val_fraction", 0) > 0 else []
    return [*build_recipe(run).health_checks(), *parity]


def report_table(config: Mapping[str, Any], table: str, runs_dir: Path, tables_dir: Path, plots_dir: Path) -> Report:
    """Write ``tables_dir/<table>.{tex,csv,md}`` and ``plots_dir/<table>_{training_curves,recall_at_k}.png``.

    Returns:
        The table's cells and the failed mechanism-health checks per (dataset, method) (marked in the table).
    """
    spec = table_spec(config, table)
    seeds = list(section(config, "tables", table).get("seeds", config["seeds"]))
    settings_by_run = {
        f"{spec.method_labels[m]} on {spec.dataset_labels[d]}": run_settings(
            resolve_run(config, d, m, seeds[0]), seeds, spec.dataset_labels[d]
        )
        for d in spec.datasets
        for m in spec.methods
    }
    settings = merge_settings(settings_by_run)
    settings["datasets"] = [spec.dataset_labels[d] for d in spec.datasets]
    runs = [RunDir.of(d, m, s, runs_dir) for d in spec.datasets for m in spec.methods for s in seeds]
    return build_report(
        runs,
        spec,
        settings,
        table_path=tables_dir / f"{table}.tex",
        curves_png=plots_dir / f"{table}_training_curves.png",
        recall_png=plots_dir / f"{table}_recall_at_k.png",
        label=f"tab:{table}",
        log_runs=[run for run in runs if logs_epochs(config, run.method)],
        health_checks={(d, m): health_checks(config, d, m, seeds[0]) for d in spec.datasets for m in spec.methods},
        note=section(config, "tables", table).get("caption", ""),
    )
