"""``retrieval_grid``: query images and their top-k retrieved test images, framed by correctness.

Spec: ``method`` (key), optional ``seeds`` (one seed; default the first top-level seed),
``queries`` (rows, default 6), ``k`` (retrieved images per row, default 5) and
``query_seed`` (default 0). One run's ``embeddings.npz`` is searched exactly
(:mod:`dmlbench.evaluation.knn`, faiss ``IndexFlatL2``) on its L2-normalised rows, which
ranks by cosine similarity; the embed step writes rows of one norm (1, or √M for M
concatenated unit-norm learners), so the ranking is the evaluation's. The protocol is the evaluation's too
(:func:`~dmlbench.evaluation.retrieval.build_task`): all-vs-all with the query itself
excluded by index, or the ``query`` rows against the ``gallery`` rows when the file has a
``split``; queries without another item of their class in the database are never chosen.

Queries: a permutation of the eligible queries drawn with ``numpy.random.default_rng(query_seed)``,
one per class first (so the rows show different classes), then the rest, in that order; they
depend only on the labels, so one ``query_seed`` shows the same queries for every method of a dataset.
Each row: the query image, titled with its class name and its exact first-hit rank, then
its k nearest database images, nearest first, framed green when their label equals the
query's and red otherwise.

Images: the rows of ``embeddings.npz`` are the prepared manifest's test rows (splits
``test``, ``query``, ``gallery``) in file order, as :func:`dmlbench.training.data.load_run_data`
selects them for the embed step (carving the validation classes only relabels ``train`` rows);
the labels are compared row by row to catch a manifest that is not the run's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dmlbench.config import ConfigError, resolve_run
from dmlbench.evaluation.evaluate import l2_normalise
from dmlbench.evaluation.files import load_embeddings_npz
from dmlbench.evaluation.knn import make_index, search
from dmlbench.evaluation.retrieval import RetrievalTask, build_task, exhaustive_first_hit_rank
from dmlbench.evaluation.validation import check_split
from dmlbench.layout import EMBEDDINGS_FILE, MANIFEST_FILE, prepared_dir, run_file
from dmlbench.report.plots import _plain, _style_context, _write_png
from dmlbench.settings import training_settings

from .common import check_methods, figure_seeds, method_label, require, title_of

if TYPE_CHECKING:
    from matplotlib.axes import Axes

KEYS = ("kind", "dataset", "title", "seeds", "method", "queries", "k", "query_seed")
DEFAULTS = {"queries": 6, "k": 5, "query_seed": 0}
LIMITS = {"queries": (1, 20), "k": (1, 20), "query_seed": (0, 2**32 - 1)}
CELL_IN = 1.1
FRAME_WIDTH = 4.0
FRAME_COLORS = {"hit": "#2ca02c", "miss": "#d62728", "query": "#7f7f7f"}


@dataclass(frozen=True)
class Retrieval:
    """The grid's content, as rows of the embeddings file (= the manifest's test rows, in order).

    Attributes:
        query_rows: (Q,) int64 row of each query.
        neighbour_rows: (Q, k) int64 rows of its k nearest database items, nearest first.
        correct: (Q, k) bool, the neighbour's label equals the query's.
        first_hit_rank: (Q,) int64 ≥ 1, exact 1-based rank of the query's first item of its class.
    """

    query_rows: np.ndarray
    neighbour_rows: np.ndarray
    correct: np.ndarray
    first_hit_rank: np.ndarray


def setting(spec: Mapping[str, Any], key: str) -> int:
    """``spec[key]`` or its default (:data:`DEFAULTS`)."""
    return int(spec.get(key, DEFAULTS[key]))


def check(config: Mapping[str, Any], spec: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; a retrieval_grid takes {list(KEYS)}")
    require(spec, ("method",), where)
    check_methods(config, [spec["method"]], f"{where}.method")
    seeds = spec.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or len(seeds) != 1):
        raise ConfigError(f"{where}.seeds must be a list of one seed (the grid shows one run), got {seeds!r}")
    for key, (low, high) in LIMITS.items():
        value = spec.get(key, DEFAULTS[key])
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{where}.{key} must be an integer in {low}..{high}, got {value!r}")


def inputs(config: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    seed = figure_seeds(config, spec)[0]
    return [run_file(spec["dataset"], spec["method"], seed, EMBEDDINGS_FILE), prepared_dir(spec["dataset"]).as_posix()]


def choose_queries(query_labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` positions among the queries: a seeded permutation, one per class first.

    Args:
        query_labels: (Q,) int labels of the eligible queries.
        count: how many to choose, at most Q.
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        (count,) int64 distinct positions in ``query_labels``; the first min(count, classes)
        of them have distinct labels.

    >>> picked = choose_queries(np.array([0, 0, 0, 1, 1, 2]), 3, seed=0)
    >>> sorted(np.array([0, 0, 0, 1, 1, 2])[picked].tolist())
    [0, 1, 2]
    """
    order = np.random.default_rng(seed).permutation(len(query_labels))
    _, first = np.unique(query_labels[order], return_index=True)
    one_per_class = np.zeros(len(order), dtype=bool)
    one_per_class[np.sort(first)] = True
    return np.concatenate([order[one_per_class], order[~one_per_class]])[:count].astype(np.int64)


def retrieve(
    embeddings: np.ndarray, labels: np.ndarray, split: np.ndarray | None, queries: int, k: int, query_seed: int
) -> Retrieval:
    """Choose ``queries`` queries (:func:`choose_queries`) and find each one's k nearest database items.

    Args:
        embeddings: (N, d) float rows, any scale (L2-normalised here: cosine ranking).
        labels: (N,) int class labels.
        split: optional (N,) 'query'/'gallery' strings (query/gallery protocol); None: all-vs-all.
        queries: rows of the grid, at most the number of eligible queries.
        k: neighbours per query, at most the database size (the query itself excluded).
        query_seed: seed of the query choice.

    Raises:
        ValueError: ``queries`` or ``k`` is larger than the data allow (the message names the key).
    """
    x = np.ascontiguousarray(l2_normalise(np.asarray(embeddings, dtype=np.float32)))
    task = build_task(np.asarray(labels), check_split(split, len(x)))
    if queries > len(task.query_rows):
        raise ValueError(
            f"queries = {queries}, but only {len(task.query_rows)} queries have an item of their class in the database"
        )
    if k > task.database_size:
        raise ValueError(f"k = {k}, but a query is ranked against only {task.database_size} items")
    picked = choose_queries(task.query_labels, queries, query_seed)
    all_vs_all = task.database_rows is None
    database = x if all_vs_all else x[task.database_rows]
    index = make_index(database, k + int(all_vs_all))
    neighbours = search(index, x, task.query_rows[picked], k, exclude_self=all_vs_all)  # (Q, k) database rows
    correct = task.database_labels[neighbours] == task.query_labels[picked, None]
    return Retrieval(
        query_rows=task.query_rows[picked],
        neighbour_rows=neighbours if task.database_rows is None else task.database_rows[neighbours],
        correct=correct,
        first_hit_rank=first_hit_ranks(x, database, task, picked, correct),
    )


def first_hit_ranks(
    x: np.ndarray, database: np.ndarray, task: RetrievalTask, picked: np.ndarray, correct: np.ndarray
) -> np.ndarray:
    """(c,) int64 exact 1-based first-hit rank of the ``picked`` queries (positions in ``task.query_rows``):
    from their ``correct`` (c, k) flags, else by the evaluation's exhaustive count (c × G distances)."""
    ranks = np.where(correct.any(axis=1), correct.argmax(axis=1) + 1, 0).astype(np.int64)
    missed = np.flatnonzero(ranks == 0)
    if len(missed):
        ranks[missed] = exhaustive_first_hit_rank(x, database, task, picked[missed], correct.shape[1] + 1)
    return ranks


def manifest_test_rows(manifest_path: Path, labels: np.ndarray, images_per_class: int | None) -> pd.DataFrame:
    """The manifest's test rows in the order the embed step embedded them (the run's
    ``training.eval_images_per_class``, ``images_per_class``, picks them); ``labels`` (N,) must match."""
    from dmlbench.data.manifest import read_manifest
    from dmlbench.training.data import evaluation_rows

    rows = evaluation_rows(read_manifest(manifest_path), images_per_class)
    if len(rows) != len(labels) or not np.array_equal(rows["label"].to_numpy(), labels):
        raise ValueError(
            f"{manifest_path}: its {len(rows)} test rows do not match the {len(labels)} rows of the "
            f"embeddings (labels differ): the run was embedded from another manifest; rebuild it"
        )
    return rows


def draw_cell(ax: Axes, path: str, color: str, title: str | None = None) -> None:
    """One image, framed in ``color``, no ticks."""
    from dmlbench.data.images import load_rgb

    ax.imshow(np.asarray(load_rgb(path)))
    ax.set(xticks=[], yticks=[])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set(edgecolor=color, linewidth=FRAME_WIDTH)
    if title is not None:
        ax.set_title(title, fontsize=8)


def render(config: Mapping[str, Any], spec: Mapping[str, Any], out_png: Path) -> None:
    # here: every validation of the parameters imports this module
    from matplotlib.figure import Figure

    npz_path, data_dir = inputs(config, spec)
    arrays = load_embeddings_npz(npz_path)
    try:
        grid = retrieve(
            arrays["embeddings"],
            arrays["labels"],
            arrays.get("split"),
            setting(spec, "queries"),
            setting(spec, "k"),
            setting(spec, "query_seed"),
        )
    except ValueError as err:
        raise ValueError(f"{out_png}: {npz_path}: {err}; lower it in the figure's spec") from err
    run = resolve_run(config, spec["dataset"], spec["method"], figure_seeds(config, spec)[0])
    rows = manifest_test_rows(
        Path(data_dir) / MANIFEST_FILE, np.asarray(arrays["labels"]), training_settings(run).eval_images_per_class
    )
    paths, names = rows["path"].to_numpy(), rows["class_name"].to_numpy()
    n_rows, k = grid.neighbour_rows.shape
    with _style_context():
        fig = Figure(figsize=(CELL_IN * (k + 1) + 2.0, CELL_IN * n_rows + 0.9), layout="constrained")
        axes = fig.subplots(n_rows, k + 1, squeeze=False)
        for r, query in enumerate(grid.query_rows):
            draw_cell(axes[r, 0], paths[query], FRAME_COLORS["query"], "query" if r == 0 else None)
            axes[r, 0].set_ylabel(
                _plain(f"{names[query]}\nfirst hit: rank {grid.first_hit_rank[r]}"),
                rotation=0,
                ha="right",
                va="center",
                fontsize=8,
            )
            for c, (row, correct) in enumerate(zip(grid.neighbour_rows[r], grid.correct[r], strict=True)):
                color = FRAME_COLORS["hit" if correct else "miss"]
                draw_cell(axes[r, c + 1], paths[row], color, f"{c + 1}" if r == 0 else None)
        seed = figure_seeds(config, spec)[0]
        fig.suptitle(
            _plain(
                spec.get("title")
                or f"{title_of(config, spec)}: top-{k} retrieval, {method_label(config, spec['method'])} (seed {seed})"
            )
        )
        fig.supxlabel("frame: green = same class as the query, red = another class; columns: rank", fontsize=8)
        _write_png(fig, out_png)
