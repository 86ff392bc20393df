"""Exact k-nearest-neighbour search with torch: blocked distance GEMM and top-k on any torch device.

The backend for machines where torch has CUDA but faiss has no GPU (the faiss-gpu wheels are CUDA 12
builds, torch 2.14.1 a CUDA 13 one); :func:`dmlbench.evaluation.knn.make_index` chooses it.
:class:`TorchFlatL2` answers ``search`` as faiss's ``IndexFlatL2`` does, with the same results:

* Squared Euclidean distances as faiss's BLAS path computes them, in float32:
  ‖q‖² + ‖x‖² − 2 q·x, negative values (rounding, for duplicates) clamped to 0. The GEMMs of faiss
  and torch (and of CPU and GPU) accumulate in different orders, so the distances agree to float32
  rounding, not bit for bit: neighbours whose distances agree to rounding error may be swapped, as
  between faiss's own CPU and GPU indexes (see :mod:`dmlbench.evaluation.knn`). Where the distances
  are exact (e.g. small integer coordinates), the neighbour lists are identical.
* Neighbours ordered by (distance, database row), exact ties by the smaller row, as faiss's CPU heaps
  order them. Each block is searched with ``torch.topk`` for k + 1 distances; only the queries whose
  k-th distance recurs at rank k + 1 (an exact tie across the cut, which ``topk`` resolves in no
  particular order) are searched again on int64 keys that pack the distance's bit pattern (which
  orders as the value does, for values ≥ +0.0) above the row.

Memory: the database (G × d float32) and its norms stay on the device; queries are taken in
blocks of b queries × g database items with at most :data:`BYTES_PER_PAIR` bytes per pair, so a
block's arrays stay under ``budget_bytes`` (:data:`MEMORY_BUDGET`, 256 MiB, by default). The
database is split (g < G, top-k of the blocks merged) only when G items would leave fewer than
:data:`MIN_QUERY_BLOCK` queries per block. The GEMM must run in IEEE float32 (torch's default:
TF32 or bf16 matmul precision would make the distances inexact); the project never changes it.
"""

from __future__ import annotations

import numpy as np
import torch

MEMORY_BUDGET = 256 << 20
"""Default bound on one block's arrays, bytes (256 MiB)."""

BYTES_PER_PAIR = 16
"""Peak bytes per (query, database item) pair of a block: the float32 distances, plus, for the queries
with a tie across the cut, a float32 copy of their distances and its int64 keys."""

MIN_QUERY_BLOCK = 64
"""Fewest queries per block before the database is split into blocks."""


def block_shape(database_size: int, budget_bytes: int) -> tuple[int, int]:
    """(queries, database items) per block, so that a block takes at most ``budget_bytes``.

    >>> block_shape(60_502, MEMORY_BUDGET)  # SOP: the whole database, 277 queries at a time
    (277, 60502)
    >>> block_shape(1_000_000, MEMORY_BUDGET)  # a larger database is split
    (64, 262144)
    >>> block_shape(10, 1)  # a budget below one pair still makes progress
    (1, 1)
    """
    pairs = max(1, budget_bytes // BYTES_PER_PAIR)
    database_block = min(database_size, max(1, pairs // MIN_QUERY_BLOCK))
    return max(1, pairs // database_block), database_block


def pack(distances: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered as the (distance, row) pairs are.

    Args:
        distances: (..., m) float32 ≥ +0.0 (not −0.0, whose sign bit would sort it first).
        rows: int64 database rows in [0, 2³²), broadcastable to ``distances``.

    Returns:
        (..., m) int64: the distance's bit pattern in the high 32 bits, the row in the low 32.
    """
    keys = distances.view(torch.int32).to(torch.int64)
    keys <<= 32
    keys |= rows
    return keys


def unpack(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 distances, int64 rows) of keys from :func:`pack`, each of the keys' shape."""
    return (keys >> 32).to(torch.int32).view(torch.float32), keys & 0xFFFFFFFF


class TorchFlatL2:
    """Exact L2 index on a torch device, with the ``search`` of faiss's ``IndexFlatL2``.

    Args:
        database: (G, d) float32, G < 2³².
        device: where the database is held and the search runs.
        budget_bytes: bound on one block's arrays (see the module docstring).
    """

    def __init__(self, database: np.ndarray, device: torch.device | str, budget_bytes: int = MEMORY_BUDGET) -> None:
        self.device = torch.device(device)
        self.database = torch.from_numpy(database).to(self.device)  # (G, d)
        self.squared_norms = (self.database * self.database).sum(dim=1)  # (G,)
        self.query_block, self.database_block = block_shape(len(database), budget_bytes)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest database items of each query, ordered by (distance, row).

        Args:
            queries: (c, d) float32.
            k: neighbours per query, 1 ≤ k ≤ G.

        Returns:
            (c, k) float32 squared distances and (c, k) int64 database rows, nearest first.
        """
        if not 1 <= k <= len(self.database):
            raise ValueError(f"k = {k} must be between 1 and the {len(self.database)} database items")
        points = torch.from_numpy(queries).to(self.device)
        keys = torch.cat(
            [self._nearest_keys(points[start:start + self.query_block], k)
             for start in range(0, len(points), self.query_block)]
        )  # fmt: skip
        distances, rows = unpack(keys.sort(dim=1).values)
        return distances.cpu().numpy(), rows.cpu().numpy()

    def _nearest_keys(self, queries: torch.Tensor, k: int) -> torch.Tensor:
        """(b, k) int64 keys (:func:`pack`) of the k nearest database items of (b, d) queries, unsorted."""
        best = self._block_keys(queries, 0, k)
        for start in range(self.database_block, len(self.database), self.database_block):
            candidates = torch.cat([best, self._block_keys(queries, start, k)], dim=1)
            best = candidates.topk(min(k, candidates.shape[1]), dim=1, largest=False, sorted=False).values
        return best

    def _block_keys(self, queries: torch.Tensor, start: int, k: int) -> torch.Tensor:
        """(b, min(k, g)) int64 keys of the nearest items of the database block of g rows from ``start``, unsorted."""
        stop = min(start + self.database_block, len(self.database))
        distances = self._distances(queries, start, stop)  # (b, g)
        k = min(k, stop - start)
        values, columns = distances.topk(min(k + 1, stop - start), dim=1, largest=False)  # sorted
        keys = pack(values[:, :k], columns[:, :k] + start)
        tied = (values[:, k:] == values[:, k - 1 : k]).any(dim=1)  # the k-th distance recurs at rank k + 1
        if tied.any():
            rows = torch.arange(start, stop, device=self.device)
            keys[tied] = pack(distances[tied], rows).topk(k, dim=1, largest=False, sorted=False).values
        return keys

    def _distances(self, queries: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """(b, g) float32 squared distances ‖q‖² + ‖x‖² − 2 q·x ≥ +0.0 to database rows [start, stop)."""
        block = self.database[start:stop]
        distances = (queries * queries).sum(dim=1, keepdim=True) + self.squared_norms[None, start:stop]
        distances.addmm_(queries, block.T, alpha=-2.0)
        return distances.clamp_min_(0.0)
