"""NMI of a K-means clustering of the embeddings against the class labels."""

from __future__ import annotations

import math
from dataclasses import dataclass

import faiss
import numpy as np

from dmlbench.evaluation.retrieval import Neighbours
from dmlbench.evaluation.timing import phase
from dmlbench.settings import KMeansSettings

PRUNED_LLOYD_MIN_WORK = 10**10
"""Smallest N·K·d (multiply-adds of one Lloyd iteration) for which the NMI's K-means runs
:func:`dmlbench.evaluation.kmeans.lloyd` instead of faiss (:func:`kmeans_fit_for_nmi`). Below it a
faiss K-means takes about a second or less (CUB: 5,924 × 100 × 512 = 3·10⁸; the synthetic dataset
smaller still); In-Shop (5·10¹⁰) and SOP (4·10¹¹) are above."""


@dataclass(frozen=True)
class KMeansFit:
    """A K-means clustering and the work it took.

    Attributes:
        assignment: (N,) int64 cluster index of each row, in [0, K).
        iterations: Lloyd iterations per run (the mean over ``nredo`` runs). faiss stops a run once its
            objective no longer changes (a fixed point: more iterations would give the same clustering),
            so a value below ``niter`` shows convergence; ``niter`` itself means the ceiling was reached.
    """

    assignment: np.ndarray
    iterations: float


def kmeans_fit(embeddings: np.ndarray, num_clusters: int, settings: KMeansSettings) -> KMeansFit:
    """faiss K-means (Euclidean) on all rows: each row's cluster and the iterations run.

    ``max_points_per_centroid`` is set above N / num_clusters so faiss never
    subsamples the training set; ``min_points_per_centroid`` is 1 so faiss does
    not warn about few points per cluster (typical in retrieval data sets).

    Args:
        embeddings: (N, d) float32, C-contiguous.
        num_clusters: K, 1 ≤ K ≤ N.
        settings: seed and iteration counts.
    """
    num_points, dim = embeddings.shape
    kmeans = faiss.Kmeans(
        dim,
        num_clusters,
        niter=settings.niter,
        nredo=settings.nredo,
        seed=settings.seed,
        max_points_per_centroid=math.ceil(num_points / num_clusters) + 1,
        min_points_per_centroid=1,
        verbose=False,
        gpu=faiss.get_num_gpus() > 0,
    )
    kmeans.train(embeddings)
    _, assignment = kmeans.index.search(embeddings, 1)
    return KMeansFit(assignment[:, 0], len(kmeans.iteration_stats) / settings.nredo)


def has_duplicate_rows(embeddings: np.ndarray) -> bool:
    """Whether two rows of ``embeddings`` (N, d) float32 are bit for bit the same vector.

    Rows are hashed (two random 32-bit linear hashes of their bit patterns), and rows of equal hashes
    compared, so the cost is one pass over the data.

    >>> has_duplicate_rows(np.array([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]], dtype=np.float32))
    True
    """
    bits = np.ascontiguousarray(embeddings, dtype=np.float32).view(np.uint32)
    weights = np.random.default_rng(0).integers(1, 2**32, size=(bits.shape[1], 2), dtype=np.uint64)
    hashes = (bits @ weights.astype(np.uint32)).astype(np.uint64)
    keys = (hashes[:, 0] << np.uint64(32)) | hashes[:, 1]
    order = np.argsort(keys, kind="stable")
    same_key = np.flatnonzero(keys[order[1:]] == keys[order[:-1]])
    return any(np.array_equal(bits[order[i]], bits[order[i + 1]]) for i in same_key)


def pruned_lloyd_applies(embeddings: np.ndarray, num_clusters: int) -> bool:
    """Whether :func:`kmeans_fit_for_nmi` runs :func:`dmlbench.evaluation.kmeans.lloyd` rather than faiss.

    Only where it pays, the work of a Lloyd iteration N·K·d ≥ :data:`PRUNED_LLOYD_MIN_WORK`, on the CPU
    (faiss has no GPU), with K < N and no two rows the same vector (exact distance ties, which faiss's
    kernels break in their own order).
    """
    num_points, dim = embeddings.shape
    return (
        num_points * num_clusters * dim >= PRUNED_LLOYD_MIN_WORK
        and num_clusters < num_points
        and faiss.get_num_gpus() == 0
        and not has_duplicate_rows(embeddings)
    )


def kmeans_fit_for_nmi(
    embeddings: np.ndarray, num_clusters: int, settings: KMeansSettings, neighbours: Neighbours | None = None
) -> KMeansFit:
    """The clustering of :func:`kmeans_fit`, computed faster where :func:`pruned_lloyd_applies`.

    There :func:`dmlbench.evaluation.kmeans.lloyd` runs faiss's algorithm (start, update, empty-cluster
    splits, stopping rule) computing only the distances an iteration can change; its clustering is
    faiss's except where a point is equidistant from two centroids up to float32 rounding (see
    :mod:`dmlbench.evaluation.kmeans`). Elsewhere faiss runs, so the small evaluations (the synthetic
    dataset, CUB, Cars) keep faiss's clustering bit for bit. ``neighbours`` (the kNN search's lists,
    all-vs-all protocol) spare :func:`~dmlbench.evaluation.kmeans.lloyd` its first search.
    """
    if not pruned_lloyd_applies(embeddings, num_clusters):
        return kmeans_fit(embeddings, num_clusters, settings)
    from dmlbench.evaluation.kmeans import lloyd

    result = lloyd(embeddings, num_clusters, settings.niter, settings.nredo, settings.seed, neighbours)
    return KMeansFit(result.assignment, result.iterations / settings.nredo)


def kmeans_assignments(embeddings: np.ndarray, num_clusters: int, settings: KMeansSettings) -> np.ndarray:
    """(N,) int64 cluster index in [0, num_clusters) of each row after :func:`kmeans_fit`."""
    return kmeans_fit(embeddings, num_clusters, settings).assignment


def _entropy(labels: np.ndarray) -> float:
    """Entropy of a labelling, natural log, as scikit-learn's ``_entropy`` computes it."""
    counts = np.unique(labels, return_counts=True)[1].astype(np.float64)
    if counts.size == 1:
        return 0.0
    total = np.sum(counts)
    return float(-np.sum((counts / total) * (np.log(counts) - math.log(total))))


def normalized_mutual_info(labels: np.ndarray, clusters: np.ndarray) -> float:
    """NMI with the arithmetic mean of the entropies as normaliser: scikit-learn's
    ``normalized_mutual_info_score(labels, clusters, average_method="arithmetic")`` (1.9), operation for
    operation, so the value is the same to the last bit; without importing scikit-learn, which costs an
    evaluation a second of start-up.

    >>> normalized_mutual_info(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]))
    1.0
    >>> normalized_mutual_info(np.array([0, 0, 0, 0]), np.array([0, 1, 2, 3]))
    0.0
    """
    classes, class_index = np.unique(labels, return_inverse=True)
    groups, group_index = np.unique(clusters, return_inverse=True)
    if len(classes) == len(groups) == 1 or len(classes) == len(groups) == 0:
        return 1.0
    # the non-zero cells of the contingency table, row by row (scipy.sparse.find's order)
    cells, counts = np.unique(class_index.astype(np.int64) * len(groups) + group_index, return_counts=True)
    rows, columns = np.divmod(cells, len(groups))
    row_sums = np.bincount(class_index, minlength=len(classes)).astype(np.int64)
    column_sums = np.bincount(group_index, minlength=len(groups)).astype(np.int64)
    if len(classes) == 1 or len(groups) == 1:
        return 0.0  # mutual information 0
    total = counts.sum()
    log_counts = np.log(counts)
    share = counts / total
    outer = row_sums.take(rows) * column_sums.take(columns)
    log_outer = -np.log(outer) + math.log(row_sums.sum()) + math.log(column_sums.sum())
    terms = share * (log_counts - math.log(total)) + share * log_outer
    terms = np.where(np.abs(terms) < np.finfo(terms.dtype).eps, 0.0, terms)
    mutual_information = float(np.clip(terms.sum(), 0.0, None))
    if mutual_information == 0:
        return 0.0
    normaliser = np.mean([_entropy(labels), _entropy(clusters)])
    return float(mutual_information / normaliser)


def clustering_nmi(
    embeddings: np.ndarray, labels: np.ndarray, settings: KMeansSettings, neighbours: Neighbours | None = None
) -> tuple[float, float]:
    """NMI (arithmetic normalisation) between the labels and K-means with K = number of distinct labels.

    Args:
        embeddings: (N, d) float32, C-contiguous.
        labels: (N,) int class labels.
        settings: K-means settings.
        neighbours: optional kNN lists of the rows (:func:`kmeans_fit_for_nmi`).

    Returns:
        NMI in [0, 1], and the Lloyd iterations K-means ran (:attr:`KMeansFit.iterations`).

    >>> x = np.array([[0.0], [0.1], [10.0], [10.1]], dtype=np.float32)
    >>> clustering_nmi(x, np.array([3, 3, 7, 7]), KMeansSettings(niter=10))
    (1.0, 3.0)
    """
    with phase("K-means"):
        fit = kmeans_fit_for_nmi(embeddings, len(np.unique(labels)), settings, neighbours)
    with phase("NMI score"):
        return normalized_mutual_info(labels, fit.assignment), fit.iterations
