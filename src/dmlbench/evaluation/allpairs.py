"""Exact all-vs-all k nearest neighbours on the CPU with one GEMM per pair of row blocks.

In the all-vs-all protocol the database is the queries themselves, so the squared distance of rows i
and j serves both: each pair of row blocks (I ≤ J) is multiplied once and its distances are offered to
the rows of I (as candidates from J) and, transposed, to the rows of J (as candidates from I). That is
half the multiply-adds of a search of every row against the database (faiss's ``IndexFlatL2``),
which does the same GEMM twice, once from each side.

* Distances: ‖x_i‖² + ‖x_j‖² − 2 x_i·x_j in float32 from one GEMM of the rows extended by their
  squared norms ([x_i, ‖x_i‖², 1] · [−2 x_j, 1, ‖x_j‖²]), negative values (rounding, for
  duplicates) clamped to 0, as faiss computes them but for the order of the additions; a row's
  distance to itself is never offered (the query excluded by index).
* Order: faiss's heaps (``float_maxheap_array_t``) keep each row's k smallest by (distance, row):
  candidates come in increasing row order for every row (blocks of lower rows first), a candidate
  equal to the k-th distance is not taken, and the heaps are sorted by (distance, row) at the end,
  as faiss's CPU search orders its results.

So the neighbours are those of a faiss search, up to the float32 rounding of the distances: two
neighbours whose distances agree to rounding error may be swapped (:mod:`dmlbench.evaluation.knn`).
Memory: the heaps (N × k × 12 bytes) and two blocks of distances (2 × 16 MiB). The GEMMs run on numpy's
BLAS threads, the heaps on one thread (faiss's OpenMP threads would contend with the BLAS threads
that wait between GEMMs: measured slower on 2 cores).
"""

from __future__ import annotations

import faiss
import numpy as np

BLOCK_ROWS = 2048
"""Rows per block: a pair of blocks is one GEMM of BLOCK_ROWS² distances (16 MiB of float32)."""

TRANSPOSE_ROWS = 16
"""Rows of a block transposed per numpy call (a whole-block transpose runs at a fraction of the speed)."""


def _extended(points: np.ndarray, norms: np.ndarray, start: int, stop: int, left: bool) -> np.ndarray:
    """Rows [start, stop) with two more columns, so that left · rightᵀ = ‖x_i‖² + ‖x_j‖² − 2 x_i·x_j."""
    rows = points[start:stop]
    extended = np.empty((len(rows), rows.shape[1] + 2), dtype=np.float32)
    if left:
        extended[:, :-2] = rows
        extended[:, -2] = norms[start:stop]
        extended[:, -1] = 1.0
    else:
        np.multiply(rows, np.float32(-2.0), out=extended[:, :-2])  # exact: a power of two
        extended[:, -2] = 1.0
        extended[:, -1] = norms[start:stop]
    return extended


def _transpose(source: np.ndarray, target: np.ndarray) -> None:
    """target[:] = source.T, a few rows of the source at a time."""
    for start in range(0, len(source), TRANSPOSE_ROWS):
        target[:, start : start + TRANSPOSE_ROWS] = source[start : start + TRANSPOSE_ROWS].T


def all_pairs_neighbours(points: np.ndarray, k: int, block_rows: int = BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest other rows of every row of ``points``, by (squared distance, row).

    Args:
        points: (N, d) float32, C-contiguous.
        k: neighbours per row, 1 ≤ k ≤ N − 1.
        block_rows: rows per block.

    Returns:
        (N, k) int64 rows and (N, k) float32 squared distances, nearest first.

    >>> x = np.array([[0.0], [1.0], [3.0], [4.5]], dtype=np.float32)
    >>> ids, distances = all_pairs_neighbours(x, 2, block_rows=3)
    >>> ids
    array([[1, 2],
           [0, 2],
           [3, 1],
           [2, 1]])
    >>> distances[2]
    array([2.25, 4.  ], dtype=float32)
    """
    num_points = len(points)
    if not 1 <= k < num_points:
        raise ValueError(f"k = {k} must be between 1 and the {num_points - 1} other rows")
    norms = np.einsum("ij,ij->i", points, points)
    distances = np.empty((num_points, k), dtype=np.float32)
    ids = np.empty((num_points, k), dtype=np.int64)
    heaps = faiss.float_maxheap_array_t()
    heaps.nh, heaps.k = num_points, k
    heaps.val, heaps.ids = faiss.swig_ptr(distances), faiss.swig_ptr(ids)
    heaps.heapify()
    block = min(block_rows, num_points)
    pair = np.empty(block * block, dtype=np.float32)
    flipped = np.empty(block * block, dtype=np.float32)
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # the heaps on one thread: between numpy's GEMMs, OpenMP threads only contend
    try:
        _fill(points, norms, heaps, block, pair, flipped)
    finally:
        faiss.omp_set_num_threads(previous)
    heaps.reorder()
    return ids, distances


def _fill(
    points: np.ndarray,
    norms: np.ndarray,
    heaps: faiss.float_maxheap_array_t,
    block: int,
    pair: np.ndarray,
    flipped: np.ndarray,
) -> None:
    """Offer the distances of every pair of row blocks to the heaps of both blocks' rows."""
    num_points = len(points)
    for j0 in range(0, num_points, block):
        j1 = min(j0 + block, num_points)
        right = _extended(points, norms, j0, j1, left=False)
        for i0 in range(0, j0 + 1, block):
            i1 = min(i0 + block, num_points)
            left = _extended(points, norms, i0, i1, left=True)
            part = pair[: (i1 - i0) * (j1 - j0)].reshape(i1 - i0, j1 - j0)
            np.matmul(left, right.T, out=part)
            np.maximum(part, 0, out=part)
            if i0 == j0:
                np.fill_diagonal(part, np.inf)  # a row is not its own neighbour
            heaps.addn(j1 - j0, faiss.swig_ptr(part), j0, i0, i1 - i0)  # rows of I, candidates from J
            if i0 != j0:
                other = flipped[: (i1 - i0) * (j1 - j0)].reshape(j1 - j0, i1 - i0)
                _transpose(part, other)
                heaps.addn(i1 - i0, faiss.swig_ptr(other), i0, j0, j1 - j0)  # rows of J, candidates from I
