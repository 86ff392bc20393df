"""The torch kNN backend (run on the CPU here) against the faiss path, and the choice between them."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dmlbench.evaluation.knn import choose_backend, faiss_threads, make_index, search
from dmlbench.evaluation.knn_torch import BYTES_PER_PAIR, MIN_QUERY_BLOCK, TorchFlatL2
from dmlbench.evaluation.retrieval import build_task, query_results

SMALL_BLOCKS = BYTES_PER_PAIR * MIN_QUERY_BLOCK * 5
"""A budget of 64 queries × 5 database items per block: k > 5 spans several database blocks."""

BUDGETS = [pytest.param(None, id="one-block"), pytest.param(SMALL_BLOCKS, id="small-blocks")]


@pytest.fixture(autouse=True)
def single_faiss_thread() -> Iterator[None]:
    """One faiss thread: on these tiny inputs OpenMP start-up and barriers cost more than the work."""
    with faiss_threads(1):
        yield


def torch_index(database: np.ndarray, budget: int | None) -> TorchFlatL2:
    """A CPU torch index with the default block budget (None) or ``budget`` bytes."""
    return TorchFlatL2(database, "cpu") if budget is None else TorchFlatL2(database, "cpu", budget)


def integer_points(num_points: int, dim: int, seed: int) -> np.ndarray:
    """(N, d) float32 with coordinates in -3..3: every float32 distance is exact, and exact ties abound."""
    return np.random.default_rng(seed).integers(-3, 4, size=(num_points, dim)).astype(np.float32)


def ties_across_cut(nearest: np.ndarray, queries: np.ndarray, database: np.ndarray) -> int:
    """Queries whose k-th distance (of the (c, k) ``nearest`` distances) is shared by an item beyond rank k."""
    distances = ((queries[:, None, :] - database[None, :, :]) ** 2).sum(axis=2)  # exact on integer points
    return int(((distances <= nearest[:, -1:]).sum(axis=1) > nearest.shape[1]).sum())


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("k", [1, 8, 40, 203])
def test_same_distances_and_order_as_faiss_on_exact_ties(budget: int | None, k: int) -> None:
    # 203 points is no multiple of the 64-query or 5-item blocks; k = 203 is the whole database
    x = integer_points(203, 3, seed=0)  # 203 points in 7³ cells: duplicates too
    faiss_distances, faiss_rows = make_index(x, k, "faiss").search(x, k)
    distances, rows = torch_index(x, budget).search(x, k)
    assert rows.dtype == np.int64 and distances.dtype == np.float32
    np.testing.assert_array_equal(rows, faiss_rows)
    np.testing.assert_array_equal(distances, faiss_distances)
    assert k == len(x) or ties_across_cut(faiss_distances, x, x) > 10  # the case topk alone gets wrong


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("k", [1, 8, 40])
def test_same_neighbours_with_self_excluded(budget: int | None, k: int) -> None:
    x = integer_points(203, 4, seed=1)  # 4 dimensions: many duplicates of each query
    rows = np.random.default_rng(2).permutation(203)[:150]
    expected = search(make_index(x, k + 1, "faiss"), x, rows, k, exclude_self=True)
    np.testing.assert_array_equal(search(torch_index(x, budget), x, rows, k, exclude_self=True), expected)


def test_self_excluded_among_more_duplicates_than_k() -> None:
    x = np.zeros((6, 3), dtype=np.float32)
    rows = np.arange(6)
    neighbours = search(torch_index(x, None), x, rows, k=2, exclude_self=True)
    assert neighbours.tolist() == [[1, 2], [0, 2], [0, 1], [0, 1], [0, 1], [0, 1]]  # as the faiss test states


@pytest.mark.parametrize("budget", BUDGETS)
def test_same_neighbours_for_queries_against_a_gallery(budget: int | None) -> None:
    x = integer_points(300, 5, seed=3)
    gallery, queries = x[:173], x[173:]  # 173 gallery items and 127 queries: no multiple of the blocks
    faiss_distances, faiss_rows = make_index(gallery, 30, "faiss").search(queries, 30)
    distances, rows = torch_index(gallery, budget).search(queries, 30)
    np.testing.assert_array_equal(rows, faiss_rows)
    np.testing.assert_array_equal(distances, faiss_distances)
    assert ties_across_cut(faiss_distances, queries, gallery) > 10


@pytest.mark.parametrize("budget", BUDGETS)
def test_random_data_differs_only_by_rounding_level_swaps(budget: int | None) -> None:
    """Float data: the two GEMMs round differently, so neighbours whose distances agree to float32 rounding
    may be swapped (as between faiss's own kernels); every other neighbour must be the same row."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1000, 32), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rows = np.arange(len(x))
    expected = search(make_index(x, 51, "faiss"), x, rows, 50, exclude_self=True)
    neighbours = search(torch_index(x, budget), x, rows, 50, exclude_self=True)
    x64 = x.astype(np.float64)

    def exact_distances(found: np.ndarray) -> np.ndarray:
        return ((x64[:, None, :] - x64[found]) ** 2).sum(axis=2)

    differ = neighbours != expected
    assert differ.mean() < 1e-3
    gap = np.abs(exact_distances(neighbours) - exact_distances(expected))
    assert (gap[differ] < 1e-6).all()


@pytest.mark.parametrize("split", [False, True])
def test_query_results_identical_with_either_backend(split: bool) -> None:
    """The whole retrieval path (first pass, deeper second pass, exact ranks) on exact-tie data."""
    rng = np.random.default_rng(5)
    x = integer_points(400, 6, seed=6)
    labels = rng.integers(0, 40, size=400)
    task = build_task(labels, rng.random(400) < 0.4 if split else None)
    results = [
        query_results(x, task, [1, 4, 100], chunk_size=97, exact_ranks=True, backend=backend)
        for backend in ("faiss", "torch")
    ]
    np.testing.assert_array_equal(results[1].first_hit_rank, results[0].first_hit_rank)
    np.testing.assert_array_equal(results[1].ap_at_r, results[0].ap_at_r)
    np.testing.assert_array_equal(results[1].r_precision, results[0].r_precision)


@pytest.mark.parametrize(
    ("k", "faiss_gpus", "cuda_available", "expected"),
    [
        (1000, 1, True, "faiss"),  # faiss-gpu installed: faiss on its GPU
        (1000, 0, True, "torch"),  # faiss-cpu beside a CUDA torch (the case)
        (1000, 0, False, "faiss"),  # CPU only: faiss on the CPU, as before
        (2048, 2, False, "faiss"),
        (2049, 2, True, "torch"),  # beyond faiss's GPU k limit
        (2049, 2, False, "faiss"),  # ... and no CUDA torch: faiss on the CPU
    ],
)
def test_choose_backend(k: int, faiss_gpus: int, cuda_available: bool, expected: str) -> None:
    assert choose_backend(k, faiss_gpus, cuda_available) == expected


def test_bad_backend_and_k_are_refused() -> None:
    x = integer_points(10, 2, seed=7)
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'faiss', 'torch'\), not 'cuda'"):
        make_index(x, 3, "cuda")
    with pytest.raises(ValueError, match=r"k = 11 must be between 1 and the 10 database items"):
        torch_index(x, None).search(x, 11)
