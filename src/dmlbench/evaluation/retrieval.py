"""Retrieval metrics (Recall@K, MAP@R, R-precision) from a chunked exact kNN search.

Protocols:

* all-vs-all (no split): every item is a query against all other items; the
  query's own row is excluded by index.
* query/gallery (In-Shop): the query rows search the gallery rows; the two sets
  are disjoint, so nothing is excluded.

Lone queries (R = 0: no other item of their class in the database) are left
out of every retrieval metric, R@K included, as pytorch-metric-learning's
``AccuracyCalculator`` leaves them out of ``precision_at_1``, ``r_precision``
and ``mean_average_precision_at_r``. Their number is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from dmlbench.evaluation.knn import FlatIndex, make_index, search_with_distances
from dmlbench.evaluation.map_at_r import average_precision_at_r, r_precision
from dmlbench.evaluation.recall import first_hit_rank, recall_from_ranks
from dmlbench.evaluation.timing import phase

FIRST_PASS_K = 64
"""Neighbours fetched for every query (at least max R); deeper searches only for queries with no hit in them."""

ALL_PAIRS_MIN_WORK = 5 * 10**10
"""Smallest N²·d for which the all-vs-all protocol searches with one GEMM per pair of row blocks
(:func:`all_pairs_applies`): 12,000 × 512-d rows and more; Cars (8,131 rows, 3.4·10¹⁰) and CUB stay on faiss."""

RANK_BLOCK_ELEMENTS = 1 << 24
"""Most query × database distances held at once (64 MiB of float32) by :func:`exhaustive_first_hit_rank`."""


def count_relevant(query_labels: np.ndarray, database_labels: np.ndarray, self_in_database: bool) -> np.ndarray:
    """R of each query: database items with its label, the query itself not counted.

    Args:
        query_labels: (Q,) int.
        database_labels: (G,) int.
        self_in_database: whether every query is itself one of the database items.

    Returns:
        (Q,) int64 ≥ 0.

    >>> count_relevant(np.array([5, 5, 6, 7]), np.array([5, 5, 6, 7]), self_in_database=True)
    array([1, 1, 0, 0])
    >>> count_relevant(np.array([5, 8]), np.array([5, 5, 6]), self_in_database=False)
    array([2, 0])
    """
    classes, counts = np.unique(database_labels, return_counts=True)
    position = np.minimum(np.searchsorted(classes, query_labels), len(classes) - 1)
    found = classes[position] == query_labels
    return np.where(found, counts[position], 0).astype(np.int64) - int(self_in_database)


@dataclass(frozen=True)
class RetrievalTask:
    """Which rows are queries and which form the database; the same for every embedding view.

    Attributes:
        query_rows: (Q,) int64 rows of the embedding matrix used as queries (lone queries removed).
        database_rows: (G,) int64 rows forming the database, or None for all rows (all-vs-all).
        query_labels: (Q,) labels of the queries.
        database_labels: (G,) labels of the database items.
        relevant_counts: (Q,) int64 R ≥ 1 of each query.
        num_lone_queries: queries left out because R = 0.
    """

    query_rows: np.ndarray
    database_rows: np.ndarray | None
    query_labels: np.ndarray
    database_labels: np.ndarray
    relevant_counts: np.ndarray
    num_lone_queries: int

    @property
    def database_size(self) -> int:
        """Number of database items a query is ranked against (itself excluded)."""
        return len(self.database_labels) - int(self.database_rows is None)


def build_task(labels: np.ndarray, query_mask: np.ndarray | None) -> RetrievalTask:
    """Set up the all-vs-all (``query_mask`` None) or query/gallery protocol.

    Args:
        labels: (N,) int.
        query_mask: (N,) bool, True for query rows and False for gallery rows, or None.

    Raises:
        ValueError: no query has a relevant item in the database.
    """
    if query_mask is None:
        candidates, database_rows, database_labels = np.arange(len(labels)), None, labels
    else:
        candidates, database_rows = np.flatnonzero(query_mask), np.flatnonzero(~query_mask)
        database_labels = labels[database_rows]
    relevant = count_relevant(labels[candidates], database_labels, self_in_database=query_mask is None)
    keep = relevant > 0
    if not keep.any():
        raise ValueError(
            f"none of the {len(candidates)} queries has an item of its class in the database, "
            "so no retrieval metric is defined"
        )
    query_rows = candidates[keep]
    return RetrievalTask(
        query_rows=query_rows,
        database_rows=database_rows,
        query_labels=labels[query_rows],
        database_labels=database_labels,
        relevant_counts=relevant[keep],
        num_lone_queries=int((~keep).sum()),
    )


def _neighbours(
    index: FlatIndex, embeddings: np.ndarray, task: RetrievalTask, queries: slice | np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(c, k) database positions of the k nearest neighbours of the selected queries, nearest first, and
    their (c, k) float32 squared distances. ``queries`` selects entries of ``task.query_rows``."""
    rows = task.query_rows[queries]
    return search_with_distances(index, embeddings, rows, k, exclude_self=task.database_rows is None)


def _relevance(
    index: FlatIndex, embeddings: np.ndarray, task: RetrievalTask, queries: slice | np.ndarray, k: int
) -> np.ndarray:
    """(c, k) bool: whether each of the k nearest neighbours of the selected queries has the query's label.

    ``queries`` selects entries of ``task.query_rows`` (a slice or an index array).
    """
    neighbours, _ = _neighbours(index, embeddings, task, queries, k)
    return task.database_labels[neighbours] == task.query_labels[queries, None]


def exhaustive_first_hit_rank(
    embeddings: np.ndarray,
    database: np.ndarray,
    task: RetrievalTask,
    queries: np.ndarray,
    floor: int,
    ties_within: int = 0,
) -> np.ndarray:
    """1-based rank of the first relevant database item of the selected queries, without a kNN search.

    Rank = 1 + the number of database items strictly closer than the query's nearest relevant item
    (the query itself excluded by index). The squared distances are computed in blocks of at most
    :data:`RANK_BLOCK_ELEMENTS` (queries × database items), so memory stays bounded. Used only for
    the queries whose first hit lies beyond the searched neighbours; ``floor`` (the searched depth + 1)
    bounds the result from below, so a float32 rounding difference from faiss cannot move a query
    back inside the searched depth (R@K stays consistent with the ranks).

    Args:
        embeddings: (N, d) float32, the rows that ``task.query_rows`` index.
        database: (G, d) float32 database (``embeddings`` itself in the all-vs-all protocol).
        task: from :func:`build_task`.
        queries: (c,) entries of ``task.query_rows``.
        floor: smallest possible rank.
        ties_within: a rank up to this depth counts, as a search orders its neighbours, the items
            as far as the first relevant one on a lower database row too (its position by (distance,
            row)); a deeper one is reported as the larger of the strict count and ``ties_within`` + 1.

    Returns:
        (c,) int64 ranks ≥ ``floor``.
    """
    squared_norms = (database * database).sum(axis=1)  # (G,)
    block = max(1, RANK_BLOCK_ELEMENTS // len(database))
    ranks = []
    for start in range(0, len(queries), block):
        selected = queries[start : start + block]
        # (c, G) squared distances less the query's own |q|², which does not change the order
        distances = squared_norms[None, :] - 2.0 * (embeddings[task.query_rows[selected]] @ database.T)
        if task.database_rows is None:
            distances[np.arange(len(selected)), task.query_rows[selected]] = np.inf
        relevant = task.database_labels[None, :] == task.query_labels[selected, None]
        nearest = np.where(relevant, distances, np.inf).min(axis=1)
        strict = 1 + (distances < nearest[:, None]).sum(axis=1)
        if ties_within:
            at_nearest = distances == nearest[:, None]
            first_row = np.argmax(relevant & at_nearest, axis=1)  # the lowest relevant row at that distance
            position = strict + (at_nearest & (np.arange(len(database)) < first_row[:, None])).sum(axis=1)
            strict = np.where(position <= ties_within, position, np.maximum(strict, ties_within + 1))
        ranks.append(strict)
    return np.maximum(np.concatenate(ranks), floor).astype(np.int64)


@dataclass(frozen=True)
class Neighbours:
    """The nearest other rows of some rows of an embedding matrix (all-vs-all protocol), nearest first.

    :func:`dmlbench.evaluation.kmeans.lloyd` takes its first assignment from them: faiss starts
    K-means from K of the rows, so a row's nearest starting centroid is usually among its neighbours.

    Attributes:
        rows: (Q,) int64 rows.
        ids: (Q, k) int64 the k nearest other rows of each, by (distance, row).
        distances: (Q, k) float32 their squared distances.
    """

    rows: np.ndarray
    ids: np.ndarray
    distances: np.ndarray


@dataclass(frozen=True)
class QueryResults:
    """Per-query retrieval results of one embedding view, in the order of ``task.query_rows``.

    Attributes:
        first_hit_rank: (Q,) int64 ≥ 1, 1-based rank of the query's first relevant database item
            (the query itself excluded); exact at any depth when computed with ``exact_ranks``,
            else any value above the searched depth means "beyond it".
        ap_at_r: (Q,) float64 AP@R in [0, 1], or None when not computed.
        r_precision: (Q,) float64 R-precision in [0, 1], or None when not computed.
        neighbours: the first search's neighbour lists, when asked for (``keep_neighbours``).
    """

    first_hit_rank: np.ndarray
    ap_at_r: np.ndarray | None = None
    r_precision: np.ndarray | None = None
    neighbours: Neighbours | None = None

    def metrics(self, recall_ks: Sequence[int]) -> dict[str, float]:
        """``R@K`` for each K, plus ``MAP@R`` and ``RP`` when computed: means over the queries."""
        metrics = dict(zip((f"R@{k}" for k in recall_ks), recall_from_ranks(self.first_hit_rank - 1, recall_ks)))
        if self.ap_at_r is not None and self.r_precision is not None:
            metrics["MAP@R"] = float(self.ap_at_r.mean())
            metrics["RP"] = float(self.r_precision.mean())
        return metrics


def query_results(
    embeddings: np.ndarray,
    task: RetrievalTask,
    recall_ks: Sequence[int],
    chunk_size: int,
    with_map_at_r: bool = True,
    exact_ranks: bool = False,
    backend: str = "auto",
    keep_neighbours: bool = False,
) -> QueryResults:
    """First-hit rank and, optionally, AP@R and R-precision of every query of one embedding view.

    Each chunk of queries is searched for k1 = max(max R, min(max K,
    ``FIRST_PASS_K``)) neighbours, enough for MAP@R, RP and the small K. Only
    the queries with no relevant item among those k1 are searched again for
    max K neighbours, which makes Recall@1000 nearly as cheap as Recall@10.
    The answer is that of a single search for max(max K, max R) neighbours
    (up to the float32-rounding caveat in :mod:`dmlbench.evaluation.knn`).
    With ``exact_ranks``, the queries with no relevant item even among those get their exact rank
    from :func:`exhaustive_first_hit_rank`; without, their rank is reported as (searched depth + 1).
    In the all-vs-all protocol at SOP-like sizes on the CPU (:func:`all_pairs_applies`), one pass of
    :func:`~dmlbench.evaluation.allpairs.all_pairs_neighbours` replaces the searches, with the same
    answer up to float32 rounding (:func:`_all_pairs_results`).

    Args:
        embeddings: (N, d) float32, C-contiguous; distances are Euclidean on these vectors.
        task: queries and database from :func:`build_task`.
        recall_ks: K values, each ≤ ``task.database_size``.
        chunk_size: queries per kNN search.
        with_map_at_r: also compute AP@R and RP (needs max(R) neighbours).
        exact_ranks: exact first-hit ranks beyond the searched depth.
        backend: where the kNN search runs (:data:`dmlbench.evaluation.knn.BACKENDS`).
        keep_neighbours: in the all-vs-all protocol, also return the first search's neighbour lists
            (:class:`Neighbours`, k1 per query, or per row on the all-pairs path; × 12 bytes).
    """
    ks = list(recall_ks)
    r = task.relevant_counts
    max_r = int(r.max()) if with_map_at_r else 0
    k_first = max(max_r, min(max(ks), FIRST_PASS_K))
    depth = max(max(ks), k_first)
    all_vs_all = task.database_rows is None
    if all_vs_all and backend == "auto" and all_pairs_applies(embeddings, k_first):
        return _all_pairs_results(embeddings, task, k_first, depth, max_r, exact_ranks, keep_neighbours)
    database = embeddings if all_vs_all else embeddings[task.database_rows]
    index = make_index(database, depth + int(all_vs_all), backend)

    keep_neighbours = keep_neighbours and all_vs_all
    ranks, average_precision, precision_at_r, kept_ids, kept_distances = [], [], [], [], []
    for start in range(0, len(r), chunk_size):
        chunk = slice(start, start + chunk_size)
        with phase("kNN search"):
            neighbours, distances = _neighbours(index, embeddings, task, chunk, k_first)
            relevance = task.database_labels[neighbours] == task.query_labels[chunk, None]
            rank = first_hit_rank(relevance)
        if keep_neighbours:
            kept_ids.append(neighbours)
            kept_distances.append(distances)
        deeper = np.flatnonzero(rank == k_first)
        if depth > k_first and len(deeper):
            with phase("deeper search"):
                rank[deeper] = first_hit_rank(_relevance(index, embeddings, task, start + deeper, depth))
        ranks.append(rank + 1)
        if with_map_at_r:
            with phase("MAP@R/RP"):
                average_precision.append(average_precision_at_r(relevance[:, :max_r], r[chunk]))
                precision_at_r.append(r_precision(relevance[:, :max_r], r[chunk]))
    ranks_1 = np.concatenate(ranks)
    beyond = np.flatnonzero(ranks_1 > depth)
    if exact_ranks and len(beyond):
        with phase("exact first-hit ranks"):
            ranks_1[beyond] = exhaustive_first_hit_rank(embeddings, database, task, beyond, depth + 1)
    kept = Neighbours(task.query_rows, np.concatenate(kept_ids), np.concatenate(kept_distances)) if kept_ids else None
    if not with_map_at_r:
        return QueryResults(ranks_1, neighbours=kept)
    return QueryResults(ranks_1, np.concatenate(average_precision), np.concatenate(precision_at_r), kept)


def all_pairs_applies(embeddings: np.ndarray, k: int) -> bool:
    """Whether :func:`query_results` searches with :func:`~dmlbench.evaluation.allpairs.all_pairs_neighbours`.

    Where it pays and where faiss would run on the CPU: N²·d ≥ :data:`ALL_PAIRS_MIN_WORK`, ``k`` < N,
    and neither faiss nor torch sees a GPU. Below the threshold faiss searches, so the evaluations of
    the synthetic dataset, CUB and Cars keep faiss's neighbours bit for bit.
    """
    from dmlbench.evaluation.knn import torch_cuda_available

    num_points, dim = embeddings.shape
    return (
        num_points * num_points * dim >= ALL_PAIRS_MIN_WORK
        and k < num_points
        and faiss.get_num_gpus() == 0
        and not torch_cuda_available()
    )


def _all_pairs_results(
    embeddings: np.ndarray,
    task: RetrievalTask,
    k_first: int,
    depth: int,
    max_r: int,
    exact_ranks: bool,
    keep_neighbours: bool,
) -> QueryResults:
    """:func:`query_results` in the all-vs-all protocol from one pass of
    :func:`~dmlbench.evaluation.allpairs.all_pairs_neighbours` for k1 neighbours of every row.

    A query without a relevant item among them gets its rank from :func:`exhaustive_first_hit_rank`
    (at least k1 + 1; up to ``depth`` its position by (distance, row), as the deeper search of the faiss
    path gives it, beyond by the strict count), so no second search runs; without ``exact_ranks`` a rank
    beyond ``depth`` is reported as depth + 1, as the search would.
    """
    from dmlbench.evaluation.allpairs import all_pairs_neighbours

    with phase("kNN search"):
        ids, distances = all_pairs_neighbours(embeddings, k_first)
        neighbours = ids[task.query_rows]
        relevance = task.database_labels[neighbours] == task.query_labels[:, None]
        ranks_1 = first_hit_rank(relevance) + 1
    misses = np.flatnonzero(ranks_1 > k_first)
    if len(misses):
        with phase("exact first-hit ranks"):
            ranks_1[misses] = exhaustive_first_hit_rank(
                embeddings, embeddings, task, misses, k_first + 1, ties_within=depth
            )
    if not exact_ranks:
        np.minimum(ranks_1, depth + 1, out=ranks_1)
    kept = Neighbours(np.arange(len(embeddings)), ids, distances) if keep_neighbours else None
    if not max_r:
        return QueryResults(ranks_1, neighbours=kept)
    with phase("MAP@R/RP"):
        within_r = relevance[:, :max_r]
        r = task.relevant_counts
        return QueryResults(ranks_1, average_precision_at_r(within_r, r), r_precision(within_r, r), kept)


def retrieval_metrics(
    embeddings: np.ndarray,
    task: RetrievalTask,
    recall_ks: Sequence[int],
    chunk_size: int,
    with_map_at_r: bool = True,
) -> dict[str, float]:
    """Recall@K and, optionally, MAP@R and R-precision of one embedding view (:func:`query_results`, averaged).

    Returns:
        ``R@K`` for each K, plus ``MAP@R`` and ``RP`` if asked, as fractions in [0, 1].
    """
    return query_results(embeddings, task, recall_ks, chunk_size, with_map_at_r).metrics(recall_ks)
