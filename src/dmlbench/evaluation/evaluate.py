"""The benchmark's metric set for one embedding matrix: Recall@K, NMI, MAP@R, R-precision."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dmlbench.evaluation.clustering import KMeansSettings, clustering_nmi
from dmlbench.evaluation.knn import faiss_threads
from dmlbench.evaluation.per_query import per_query_arrays
from dmlbench.evaluation.retrieval import QueryResults, build_task, query_results, retrieval_metrics
from dmlbench.evaluation.timing import phase
from dmlbench.evaluation.validation import (
    check_embeddings,
    check_labels,
    check_learner_slices,
    check_not_collapsed,
    check_positive,
    check_recall_ks,
    check_split,
    check_stats,
    check_views,
)
from dmlbench.settings import DEFAULT_CHUNK_SIZE


def l2_normalise(embeddings: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm; all-zero rows stay zero.

    Args:
        embeddings: (N, d) float32.

    Returns:
        (N, d) float32, C-contiguous.

    >>> l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    array([[0.6, 0.8],
           [0. , 0. ]], dtype=float32)
    """
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    return np.divide(embeddings, norms, out=np.zeros_like(embeddings), where=norms > 0)


def _views(
    embeddings: np.ndarray, learner_slices: list[tuple[int, int]], named: dict[str, tuple[int, int]]
) -> Iterator[tuple[str, np.ndarray]]:
    """(key prefix, embeddings) of the full embedding as given, then of each L2-normalised learner
    slice, then of each L2-normalised named view."""
    yield "", embeddings
    for m, (start, stop) in enumerate(learner_slices):
        yield f"learner{m}/", l2_normalise(embeddings[:, start:stop])
    for name, (start, stop) in named.items():
        yield f"{name}/", l2_normalise(embeddings[:, start:stop])


def self_pair_similarity(embeddings: np.ndarray, learner_slices: Sequence[tuple[int, int]]) -> float:
    """Mean cosine similarity between two learners' embeddings of the *same* image.

    Averaged over images and over all learner pairs m < m'; the learners must have equal widths.
    High values mean the learners agree (a redundant ensemble); ABE's divergence loss lowers it.

    Args:
        embeddings: (N, d) float.
        learner_slices: M ≥ 2 [start, stop) ranges of equal width.

    >>> x = np.array([[1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]], dtype=np.float32)
    >>> self_pair_similarity(x, [(0, 2), (2, 4)])  # the same for image 0, orthogonal for image 1
    0.5
    """
    widths = {stop - start for start, stop in learner_slices}
    if len(learner_slices) < 2 or len(widths) != 1:
        raise ValueError(f"self-pair similarity needs ≥ 2 learners of equal width, got slices {list(learner_slices)}")
    parts = np.stack([l2_normalise(embeddings[:, a:b]) for a, b in learner_slices])  # (M, N, w)
    total = parts.sum(axis=0)  # (N, w); sum over pairs m≠m' of <e_m, e_m'> = |Σ e|² − Σ |e|²
    pair_sums = (total * total).sum(axis=1) - (parts * parts).sum(axis=(0, 2))
    m = len(learner_slices)
    return float(pair_sums.mean() / (m * (m - 1)))


def _learner_means(metrics: dict[str, float], num_learners: int) -> dict[str, float]:
    """``learners_mean/<metric>``: each metric averaged over the learners (their ``learner{m}/`` keys)."""
    names = [key.split("/", 1)[1] for key in metrics if key.startswith("learner0/")]
    return {
        f"learners_mean/{name}": float(np.mean([metrics[f"learner{m}/{name}"] for m in range(num_learners)]))
        for name in names
    }


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate_views` computes.

    Attributes:
        metrics: the flat metrics (``metrics.json``).
        per_query: the per-query arrays (``per_query.npz``, :mod:`dmlbench.evaluation.per_query`).
    """

    metrics: dict[str, float]
    per_query: dict[str, np.ndarray]


def evaluate_embeddings(
    embeddings: np.ndarray, labels: np.ndarray, recall_ks: Sequence[int], **options: Any
) -> dict[str, float]:
    """The metrics of :func:`evaluate_views` (same arguments), without the per-query arrays."""
    return evaluate_views(embeddings, labels, recall_ks, **options).metrics


def evaluate_views(
    embeddings: np.ndarray,
    labels: np.ndarray,
    recall_ks: Sequence[int],
    split: np.ndarray | None = None,
    learner_slices: np.ndarray | None = None,
    view_names: np.ndarray | None = None,
    view_slices: np.ndarray | None = None,
    stat_names: np.ndarray | None = None,
    stat_values: np.ndarray | None = None,
    kmeans: KMeansSettings = KMeansSettings(),
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    num_threads: int | None = None,
) -> Evaluation:
    """Retrieval and clustering metrics of test-set embeddings, and the per-query results behind them.

    The full embedding is evaluated **as given** (callers pass the
    concatenation of the L2-normalised learners, which is what the methods use
    at test time); each learner slice is L2-normalised on its own first
    (all-zero rows stay zero).
    Distances are exact Euclidean distances (faiss ``IndexFlatL2``; from SOP-like sizes on, all-vs-all,
    :mod:`dmlbench.evaluation.allpairs`, the same neighbours up to float32 rounding at half the GEMM).

    Retrieval (see :mod:`dmlbench.evaluation.retrieval`): without ``split``
    every item queries all other items, itself excluded by index; with
    ``split`` the 'query' rows search the 'gallery' rows. Queries with no
    other item of their class in the database (R = 0) are left out of R@K,
    MAP@R and RP, as in pytorch-metric-learning; ``num_lone_queries`` counts
    them. NMI clusters all N rows (query and gallery together) with faiss's
    K-means, K = number of distinct labels among them (from SOP-like sizes on, the same algorithm
    computing only the distances that change, :func:`~dmlbench.evaluation.clustering.kmeans_fit_for_nmi`).

    Args:
        embeddings: (N, d) float, finite.
        labels: (N,) int class labels.
        recall_ks: K values of Recall@K, each at most the database size.
        split: optional (N,) 'query' / 'gallery' strings.
        learner_slices: optional (M, 2) int [start, stop) column ranges, one
            per learner, within [0, d] and not overlapping.
        view_names, view_slices: optional (V,) names and (V, 2) [start, stop) ranges of
            other column groups evaluated on their own (e.g. DeML's scales); may overlap.
        stat_names, stat_values: optional (S,) names and (S,) finite numbers about the
            model or its training (parameters, FLOPs, ...), copied into the result.
        kmeans: K-means settings for NMI.
        chunk_size: queries per kNN search; peak memory is
            O(chunk_size × k + N × d) with k = max(max K, max R).
        num_threads: faiss and BLAS threads during the call (None: their defaults).

    Returns:
        ``per_query``: the arrays of :mod:`dmlbench.evaluation.per_query` (first-hit ranks exact at
        any depth, AP@R, R-precision; per view). ``metrics``: a flat dict of Python floats:
        ``R@K`` for each K, ``NMI``, ``MAP@R``, ``RP`` (fractions in [0, 1]); the same prefixed ``learner{m}/`` for each
        learner slice, ``learners_mean/`` for their mean and ``<name>/`` for each named
        view; ``self_similarity`` (:func:`self_pair_similarity`) for ≥ 2 learners of
        equal width; the stats; ``num_queries`` (queries evaluated), ``num_lone_queries``,
        ``num_classes``, ``kmeans_seed``, ``kmeans_niter``, ``kmeans_nredo``, and (per view, like NMI)
        ``kmeans_iterations``: the Lloyd iterations K-means ran, below ``kmeans_niter`` when it
        reached a fixed point.

    Raises:
        ValueError: an input is malformed (the message says which and how);
            :class:`~dmlbench.evaluation.validation.CollapsedEmbeddingsError` when every database row is the
            same vector (a collapsed model: the metrics would only reflect the order of the rows).
        TypeError: embeddings, labels or learner_slices have the wrong dtype.
    """
    with phase("checks"):
        x = check_embeddings(embeddings)
        y = check_labels(labels, len(x))
        query_mask = check_split(split, len(x))
        slices = check_learner_slices(learner_slices, x.shape[1])
        named = check_views(view_names, view_slices, x.shape[1])
        stats = check_stats(stat_names, stat_values)
        check_positive(chunk_size, "chunk_size")
        check_positive(num_threads, "num_threads", optional=True)
        task = build_task(y, query_mask)
        check_not_collapsed(x, task.database_rows)
        ks = check_recall_ks(recall_ks, task.database_size)

    metrics: dict[str, float] = {}
    per_view: dict[str, QueryResults] = {}
    with faiss_threads(num_threads):
        for prefix, view in _views(x, slices, named):
            results = query_results(view, task, ks, chunk_size, exact_ranks=True, keep_neighbours=True)
            view_metrics = results.metrics(ks)
            view_metrics["NMI"], view_metrics["kmeans_iterations"] = clustering_nmi(view, y, kmeans, results.neighbours)
            per_view[prefix] = replace(results, neighbours=None)  # the lists only served K-means
            metrics.update({prefix + name: value for name, value in view_metrics.items()})
    if slices:
        metrics.update(_learner_means(metrics, len(slices)))
    if len(slices) >= 2 and len({stop - start for start, stop in slices}) == 1:
        metrics["self_similarity"] = self_pair_similarity(x, slices)
    metrics.update(stats)
    metrics.update(
        num_queries=float(len(task.query_rows)),
        num_lone_queries=float(task.num_lone_queries),
        num_classes=float(len(np.unique(y))),
        **kmeans.as_metrics(),
    )
    with phase("per-query arrays"):
        return Evaluation(metrics, per_query_arrays(task, per_view))


def recall_at_k(
    embeddings: np.ndarray,
    labels: np.ndarray,
    ks: Sequence[int],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    num_threads: int | None = None,
    split: np.ndarray | None = None,
) -> dict[int, float]:
    """Recall@K only (no K-means, no MAP@R): the cheap per-epoch model-selection metric.

    Without ``split`` each item queries all others (itself excluded by index);
    with ``split`` ((N,) 'query'/'gallery') queries search the gallery, as in
    :func:`evaluate_embeddings`. Queries whose class has no other item in the
    database are left out. Unlike :func:`evaluate_views` it scores identical rows
    (an epoch of a collapsed model scores by tie-breaking, so a training run goes on
    to its own checks); the final evaluation refuses them.

    Args:
        embeddings: (N, d) float, finite; Euclidean distances on these vectors.
        labels: (N,) int class labels.
        ks: K values, each ≤ N - 1.
        chunk_size: queries per kNN search.
        num_threads: faiss and BLAS threads during the call (None: their defaults).

    Returns:
        {K: fraction of queries with a same-label item among their K nearest neighbours}.

    Four points on a line, classes 0, 1, 0, 1; the nearest same-label item is
    at rank 2, 3, 3 and 2 respectively:

    >>> x = np.array([[0.0], [1.0], [2.5], [4.0]], dtype=np.float32)
    >>> recall_at_k(x, np.array([0, 1, 0, 1]), [1, 2, 3])
    {1: 0.0, 2: 0.5, 3: 1.0}
    """
    x = check_embeddings(embeddings)
    y = check_labels(labels, len(x))
    check_positive(chunk_size, "chunk_size")
    check_positive(num_threads, "num_threads", optional=True)
    task = build_task(y, check_split(split, len(x)))
    checked_ks = check_recall_ks(ks, task.database_size)
    with faiss_threads(num_threads):
        metrics = retrieval_metrics(x, task, checked_ks, chunk_size, with_map_at_r=False)
    return {k: metrics[f"R@{k}"] for k in checked_ks}
