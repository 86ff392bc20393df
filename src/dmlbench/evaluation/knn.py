"""Exact k-nearest-neighbour search with faiss, or with torch where only torch has a GPU.

The search is exhaustive (``faiss.IndexFlatL2``: exact squared Euclidean
distances, no approximation). :func:`choose_backend` picks where it runs: faiss
on the GPU when faiss sees one and ``k`` is within its GPU limit; else torch on
CUDA when torch sees a GPU (:mod:`dmlbench.evaluation.knn_torch`: the faiss-gpu
wheels are CUDA 12 builds, torch a CUDA 13 one); else faiss on the CPU. Queries
are searched in chunks by the caller, so peak memory is the index (a copy of the
database, G × d float32) plus one chunk of results (chunk_size × k), plus, with
torch, one block of distances (at most 256 MiB).

Neighbours are ordered by (distance, database row): faiss's CPU heaps break
exact ties by the smaller row index, so duplicates are returned in a
deterministic order. Results do not depend on ``chunk_size`` when distances are
computed exactly; otherwise faiss may pick a different kernel (direct or BLAS)
for a different number of queries, which can only swap neighbours whose float32
distances agree to rounding error. The same holds between CPU and GPU faiss,
and between faiss and torch, which orders by (distance, row) too.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Protocol

import faiss
import numpy as np

GPU_MAX_K = 2048
"""Largest k that faiss's GPU flat index supports; larger searches run elsewhere."""

BACKENDS = ("auto", "faiss", "torch")
"""Values of ``backend``: "auto" (:func:`choose_backend`), or forced: "faiss" (on its GPU if it has one
and k allows, else on the CPU) or "torch" (on CUDA if torch sees a GPU, else on the CPU)."""


class FlatIndex(Protocol):
    """An exact L2 index: ``faiss.IndexFlatL2`` or :class:`~dmlbench.evaluation.knn_torch.TorchFlatL2`."""

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(c, k) float32 squared distances and (c, k) int64 database rows of the (c, d) queries ``x``."""


@contextlib.contextmanager
def faiss_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with faiss (OpenMP) and the BLAS libraries (numpy's GEMMs of
    :mod:`~dmlbench.evaluation.allpairs` and :mod:`~dmlbench.evaluation.kmeans`) limited to ``num_threads``;
    ``None`` leaves their defaults.

    The previous settings are restored on exit.
    """
    if num_threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency

    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(num_threads)
    try:
        with threadpool_limits(limits=num_threads, user_api="blas"):
            yield
    finally:
        faiss.omp_set_num_threads(previous)


def choose_backend(k: int, faiss_gpus: int, cuda_available: bool) -> str:
    """The backend, "faiss" or "torch", for searches of ``k`` neighbours.

    faiss on its GPU where it can (``faiss_gpus`` > 0, ``k`` ≤ :data:`GPU_MAX_K`); else torch on CUDA
    where torch sees a GPU (``cuda_available``); else faiss on the CPU.

    >>> choose_backend(100, faiss_gpus=1, cuda_available=True)
    'faiss'
    >>> choose_backend(100, faiss_gpus=0, cuda_available=True)  # faiss-cpu beside a CUDA torch
    'torch'
    >>> choose_backend(GPU_MAX_K + 1, faiss_gpus=1, cuda_available=True)  # beyond faiss's GPU limit
    'torch'
    >>> choose_backend(GPU_MAX_K + 1, faiss_gpus=1, cuda_available=False)
    'faiss'
    >>> choose_backend(100, faiss_gpus=0, cuda_available=False)
    'faiss'
    """
    if faiss_gpus > 0 and k <= GPU_MAX_K:
        return "faiss"
    return "torch" if cuda_available else "faiss"


#: Device files of a GPU driver (NVIDIA's, or AMD's for ROCm builds of torch); without any, no GPU is usable.
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd")


def torch_cuda_available() -> bool:
    """Whether torch sees a CUDA GPU. On a machine without a GPU driver this answers without importing
    torch (``import dmlbench.evaluation`` does not import it; importing it costs ~1.5 s per evaluation)."""
    if "torch" not in sys.modules and not any(os.path.exists(path) for path in GPU_DRIVER_FILES):
        return False
    import torch

    return torch.cuda.is_available()


def make_index(database: np.ndarray, k: int, backend: str = "auto") -> FlatIndex:
    """An exact L2 index holding ``database`` (G, d) float32 for searches of up to ``k`` neighbours.

    Args:
        database: (G, d) float32.
        k: the most neighbours a search will ask for (faiss's GPU index has a limit).
        backend: one of :data:`BACKENDS`.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    cuda = backend != "faiss" and torch_cuda_available()
    if backend == "auto":
        backend = choose_backend(k, faiss.get_num_gpus(), cuda)
    if backend == "torch":
        from dmlbench.evaluation.knn_torch import TorchFlatL2

        return TorchFlatL2(database, "cuda" if cuda else "cpu")
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
    return neighbours[_kept(neighbours, self_ids)].reshape(len(neighbours), -1)


def _kept(neighbours: np.ndarray, self_ids: np.ndarray) -> np.ndarray:
    """(c, k + 1) bool: the entries :func:`exclude_self_from` keeps."""
    is_self = neighbours == self_ids[:, None]
    is_self[~is_self.any(axis=1), -1] = True
    return ~is_self


def search(index: FlatIndex, points: np.ndarray, rows: np.ndarray, k: int, exclude_self: bool) -> np.ndarray:
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
    return search_with_distances(index, points, rows, k, exclude_self)[0]


def search_with_distances(
    index: FlatIndex, points: np.ndarray, rows: np.ndarray, k: int, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search`, with the (c, k) float32 squared distances of the neighbours returned."""
    k_search = k + 1 if exclude_self else k
    distances, neighbours = index.search(points[rows], k_search)
    if not exclude_self:
        return neighbours, distances
    kept = _kept(neighbours, rows)
    return neighbours[kept].reshape(len(rows), -1), distances[kept].reshape(len(rows), -1)
