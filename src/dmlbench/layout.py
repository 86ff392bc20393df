"""Where the workflow's files live, stated once: the prepared datasets, the pretraining stages' weights, the
run folders, the names of a run's files and the columns of its training log.

::

    data/prepared/<dataset>/manifest.csv                      prepare (and the images it lists)
    data/pretrained/<dataset>/<backbone>.pt                   pretrain (+ .sha256; its run in <backbone>_run/)
    results/runs/<dataset>/<method>/seed<seed>/               one run:
        run.yaml, checkpoint.pt, log.csv                      train (re-embedded and ensemble runs have none)
        embeddings.npz                                        embed, reembed or ensemble
        metrics.json, per_query.npz                           evaluate

Paths are relative to the project's root, as the workflow's rules name them. The rules, the command line's
defaults, the report and the benchmarks build them here; a name that becomes a folder goes through
:func:`dmlbench.paths.contained`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from dmlbench.paths import contained

#: the run folders: ``<RUNS_DIR>/<dataset>/<method>/seed<seed>``.
RUNS_DIR = Path("results/runs")
#: the prepared datasets: ``<PREPARED_DIR>/<dataset>``.
PREPARED_DIR = Path("data/prepared")
#: the pretraining stages' outputs: ``<PRETRAINED_DIR>/<dataset>/<backbone>.pt``.
PRETRAINED_DIR = Path("data/pretrained")

#: a prepared dataset's image list (splits, labels, boxes).
MANIFEST_FILE = "manifest.csv"
#: a run's resolved settings, written before training.
RUN_FILE = "run.yaml"
#: a trained run's selected weights and its resolved run.
CHECKPOINT_FILE = "checkpoint.pt"
#: a trained run's per-epoch log (:data:`LOG_COLUMNS`, then the recipe's own columns).
LOG_FILE = "log.csv"
#: a run's test-set embeddings and labels.
EMBEDDINGS_FILE = "embeddings.npz"
#: a run's evaluation: flat metric keys (fractions) and bookkeeping numbers.
METRICS_FILE = "metrics.json"
#: a run's per-query results beside :data:`METRICS_FILE` (:mod:`dmlbench.evaluation.per_query`).
PER_QUERY_FILE = "per_query.npz"

#: the columns every ``log.csv`` starts with, in this order: epoch (1, 2, …), mean training loss, validation and
#: test R@1 (fractions; empty when not computed), learning rate, epoch seconds, training images per second,
#: and the share of the epoch spent waiting for the data loader.
LOG_COLUMNS = ("epoch", "loss", "val_R@1", "test_R@1", "lr", "seconds", "images_per_s", "loader_wait_share")

#: the run folder as a Snakemake pattern (wildcards ``dataset``, ``method``, ``seed``).
RUN_DIR_PATTERN = f"{RUNS_DIR.as_posix()}/{{dataset}}/{{method}}/seed{{seed}}"

_SEED_FOLDER = re.compile(r"^seed(\d+)$")


class RunKey(NamedTuple):
    """One run's identity."""

    dataset: str
    method: str
    seed: int


def run_dir(dataset: str, method: str, seed: int, runs_dir: str | os.PathLike[str] = RUNS_DIR) -> Path:
    """A run's folder, ``<runs_dir>/<dataset>/<method>/seed<seed>``.

    >>> run_dir("cub200", "triplet", 0).as_posix()
    'results/runs/cub200/triplet/seed0'
    """
    return contained(runs_dir, dataset, method, f"seed{seed}")


def run_file(dataset: str, method: str, seed: int, filename: str) -> str:
    """One file of a run, as the workflow names it (``results/runs/<dataset>/<method>/seed<seed>/<filename>``).

    >>> run_file("cub200", "triplet", 2, METRICS_FILE)
    'results/runs/cub200/triplet/seed2/metrics.json'
    """
    return (run_dir(dataset, method, seed) / filename).as_posix()


def run_key(folder: str | os.PathLike[str]) -> RunKey | None:
    """The run of a run folder ``…/<dataset>/<method>/seed<seed>`` (under any root), None for another path.

    >>> run_key("elsewhere/runs/cub200/triplet/seed3"), run_key("results/runs/cub200/triplet")
    (RunKey(dataset='cub200', method='triplet', seed=3), None)
    """
    path = Path(folder)
    match = _SEED_FOLDER.match(path.name)
    if match is None or len(path.parts) < 3:
        return None
    return RunKey(path.parent.parent.name, path.parent.name, int(match.group(1)))


def run_of(path: str | os.PathLike[str]) -> RunKey | None:
    """The run whose folder under :data:`RUNS_DIR` holds the file ``path``; None for a file elsewhere.

    >>> run_of("results/runs/cub200/triplet/seed0/embeddings.npz"), run_of("data/prepared/cub200")
    (RunKey(dataset='cub200', method='triplet', seed=0), None)
    """
    path = Path(path)
    if not path.is_relative_to(RUNS_DIR) or len(path.relative_to(RUNS_DIR).parts) < 4:
        return None
    return run_key(RUNS_DIR.joinpath(*path.relative_to(RUNS_DIR).parts[:3]))


def prepared_dir(dataset: str) -> Path:
    """A prepared dataset's folder (its :data:`MANIFEST_FILE` and images): rule prepare's output.

    >>> prepared_dir("cub200").as_posix()
    'data/prepared/cub200'
    """
    return contained(PREPARED_DIR, dataset)


def manifest_path(dataset: str) -> Path:
    """Where ``prepare`` writes a dataset's manifest.

    >>> manifest_path("cub200").as_posix()
    'data/prepared/cub200/manifest.csv'
    """
    return prepared_dir(dataset) / MANIFEST_FILE


def pretrained_path(source: str, backbone: str) -> Path:
    """The weights file of a pretraining stage: ``data/pretrained/<source>/<backbone>.pt``.

    >>> pretrained_path("synthetic", "small_cnn").as_posix()
    'data/pretrained/synthetic/small_cnn.pt'
    """
    return PRETRAINED_DIR / source / f"{backbone}.pt"


def pretraining_run_dir(weights: str | os.PathLike[str]) -> Path:
    """The run folder of the pretraining stage that writes ``weights`` (beside it, ``<backbone>_run``).

    >>> pretraining_run_dir(pretrained_path("synthetic", "small_cnn")).as_posix()
    'data/pretrained/synthetic/small_cnn_run'
    """
    weights = Path(weights)
    return weights.with_name(f"{weights.stem}_run")
