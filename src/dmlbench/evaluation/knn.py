"""Exact k-nearest-neighbour search with faiss.

The search is exhaustive (``faiss.IndexFlatL2``: exact squared Euclidean
distances, no approximation). It runs on the GPU when faiss sees one and ``k``
is within the GPU limit, on the CPU otherwise. Queries are searched in chunks
by the caller, so peak memory is the index (a copy of the database, G × d
float32) plus one chunk of results (chunk_size × k).

Neighbours are ordered by (distance, database row): faiss's CPU heaps break
exact ties by the smaller row index, so duplicates are returned in a
deterministic order. Results do not depend on ``chunk_size`` when distances are
computed exactly; otherwise faiss may pick a different kernel (direct or BLAS)
for a different number of queries, which can only swap neighbours whose float32
distances agree to rounding error. The same holds between CPU and GPU faiss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import faiss
import numpy as np

GPU_MAX_K = 2048
"""Largest k that faiss's GPU flat index supports; larger searches run on the CPU."""


@contextlib.contextmanager
def faiss_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with faiss (OpenMP) limited to ``num_threads``; ``None`` leaves faiss's default.

    The previous setting is restored on exit.
    """
    if num_threads is None:
        yield
        return
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(num_threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def make_index(database: np.ndarray, k: int) -> faiss.Index:
    """An exact L2 index holding ``database`` (G, d) float32, on the GPU if one is usable for ``k``."""
    index = faiss.IndexFlatL2(database.shape[1])
    if faiss.get_num_gpus() > 0 and k <= GPU_MAX_K:
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(database)
    return index


def exclude_self_from(neighbours: np.ndarray, self_ids: np.ndarray) -> np.ndarray:
    """Drop each query's own database row from its neighbour list.

    The query is excluded by index, not by distance 0, so duplicates of the
    query stay retrievable. Where the query is not among the neighbours (more
    than k items share its position), the last neighbour is dropped instead,
    as pytorch-metric-learning does.

    Args:
        neighbours: (c, k + 1) database rows, nearest first.
        self_ids: (c,) the database row of each query.

    Returns:
        (c, k) database rows, nearest first.

    >>> exclude_self_from(np.array([[0, 2, 1], [0, 1, 2], [1, 0, 2]]), np.array([0, 2, 3]))
    array([[2, 1],
           [0, 1],
           [1, 0]])
    """
    is_self = neighbours == self_ids[:, None]
    is_self[~is_self.any(axis=1), -1] = True
    return neighbours[~is_self].reshape(len(neighbours), -1)


def search(index: faiss.Index, points: np.ndarray, rows: np.ndarray, k: int, exclude_self: bool) -> np.ndarray:
    """The k nearest database rows of the queries ``points[rows]``, nearest first.

    Args:
        index: from :func:`make_index`.
        points: (N, d) float32, C-contiguous; only the ``rows`` are gathered, so no (Q, d) copy is made.
        rows: (c,) rows of ``points`` to use as queries.
        k: neighbours per query, at most G (G - 1 with ``exclude_self``).
        exclude_self: the database is ``points`` itself (all-vs-all), so each
            query's own row is excluded, by index.

    Returns:
        (c, k) int64 database rows.
    """
    k_search = k + 1 if exclude_self else k
    _, neighbours = index.search(points[rows], k_search)
    return exclude_self_from(neighbours, rows) if exclude_self else neighbours
