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

import numpy as np

from dmlbench.evaluation.knn import FlatIndex, make_index, search
from dmlbench.evaluation.map_at_r import average_precision_at_r, r_precision
from dmlbench.evaluation.recall import first_hit_rank, recall_from_ranks

FIRST_PASS_K = 64
"""Neighbours fetched for every query (at least max R); deeper searches only for queries with no hit in them."""

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


def _relevance(
    index: FlatIndex, embeddings: np.ndarray, task: RetrievalTask, queries: slice | np.ndarray, k: int
) -> np.ndarray:
    """(c, k) bool: whether each of the k nearest neighbours of the selected queries has the query's label.

    ``queries`` selects entries of ``task.query_rows`` (a slice or an index array).
    """
    neighbours = search(index, embeddings, task.query_rows[queries], k, exclude_self=task.database_rows is None)
    return task.database_labels[neighbours] == task.query_labels[queries, None]


def exhaustive_first_hit_rank(
    embeddings: np.ndarray, database: np.ndarray, task: RetrievalTask, queries: np.ndarray, floor: int
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

    Returns:
        (c,) int64 ranks ≥ ``floor``.
    """
    squared_norms = (database * database).sum(axis=1)  # (G,)
    block = max(1, RANK_BLOCK_ELEMENTS // len(database))
    ranks = []
    for start in range(0, len(queries), block):
        selected = queries[start:start + block]
        # (c, G) squared distances less the query's own |q|², which does not change the order
        distances = squared_norms[None, :] - 2.0 * (embeddings[task.query_rows[selected]] @ database.T)
        if task.database_rows is None:
            distances[np.arange(len(selected)), task.query_rows[selected]] = np.inf
        relevant = task.database_labels[None, :] == task.query_labels[selected, None]
        nearest = np.where(relevant, distances, np.inf).min(axis=1)
        ranks.append(1 + (distances < nearest[:, None]).sum(axis=1))
    return np.maximum(np.concatenate(ranks), floor).astype(np.int64)


@dataclass(frozen=True)
class QueryResults:
    """Per-query retrieval results of one embedding view, in the order of ``task.query_rows``.

    Attributes:
        first_hit_rank: (Q,) int64 ≥ 1, 1-based rank of the query's first relevant database item
            (the query itself excluded); exact at any depth when computed with ``exact_ranks``,
            else any value above the searched depth means "beyond it".
        ap_at_r: (Q,) float64 AP@R in [0, 1], or None when not computed.
        r_precision: (Q,) float64 R-precision in [0, 1], or None when not computed.
    """

    first_hit_rank: np.ndarray
    ap_at_r: np.ndarray | None = None
    r_precision: np.ndarray | None = None

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

    Args:
        embeddings: (N, d) float32, C-contiguous; distances are Euclidean on these vectors.
        task: queries and database from :func:`build_task`.
        recall_ks: K values, each ≤ ``task.database_size``.
        chunk_size: queries per kNN search.
        with_map_at_r: also compute AP@R and RP (needs max(R) neighbours).
        exact_ranks: exact first-hit ranks beyond the searched depth.
        backend: where the kNN search runs (:data:`dmlbench.evaluation.knn.BACKENDS`).
    """
    ks = list(recall_ks)
    r = task.relevant_counts
    max_r = int(r.max()) if with_map_at_r else 0
    k_first = max(max_r, min(max(ks), FIRST_PASS_K))
    depth = max(max(ks), k_first)
    all_vs_all = task.database_rows is None
    database = embeddings if all_vs_all else embeddings[task.database_rows]
    index = make_index(database, depth + int(all_vs_all), backend)

    ranks, average_precision, precision_at_r = [], [], []
    for start in range(0, len(r), chunk_size):
        chunk = slice(start, start + chunk_size)
        relevance = _relevance(index, embeddings, task, chunk, k_first)
        rank = first_hit_rank(relevance)
        deeper = np.flatnonzero(rank == k_first)
        if depth > k_first and len(deeper):
            rank[deeper] = first_hit_rank(_relevance(index, embeddings, task, start + deeper, depth))
        ranks.append(rank + 1)
        if with_map_at_r:
            average_precision.append(average_precision_at_r(relevance[:, :max_r], r[chunk]))
            precision_at_r.append(r_precision(relevance[:, :max_r], r[chunk]))
    ranks_1 = np.concatenate(ranks)
    beyond = np.flatnonzero(ranks_1 > depth)
    if exact_ranks and len(beyond):
        ranks_1[beyond] = exhaustive_first_hit_rank(embeddings, database, task, beyond, depth + 1)
    if not with_map_at_r:
        return QueryResults(ranks_1)
    return QueryResults(ranks_1, np.concatenate(average_precision), np.concatenate(precision_at_r))


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
