"""The all-vs-all search of large evaluations (dmlbench.evaluation.allpairs): one GEMM per pair of row
blocks, against brute force and against the faiss path it replaces there."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from dmlbench.evaluation import evaluate_views, recall_at_k, retrieval
from dmlbench.evaluation.allpairs import all_pairs_neighbours
from dmlbench.evaluation.knn import faiss_threads
from dmlbench.evaluation.retrieval import all_pairs_applies, build_task, query_results


@pytest.fixture(autouse=True)
def single_faiss_thread() -> Iterator[None]:
    with faiss_threads(1):
        yield


def brute_force(x: np.ndarray, k: int) -> np.ndarray:
    """(N, k) nearest other rows by (float64 squared distance, row)."""
    distances = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(distances, np.inf)
    return np.lexsort((np.broadcast_to(np.arange(len(x)), distances.shape), distances), axis=1)[:, :k]


@pytest.mark.parametrize("block_rows", [1, 7, 64, 2048])
def test_neighbours_by_distance_then_row_on_exact_ties(block_rows: int) -> None:
    """Integer coordinates: every distance exact, many exact ties (duplicates too), broken by the row."""
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=(150, 3)).astype(np.float32)
    for k in (1, 5, 40):
        ids, distances = all_pairs_neighbours(x, k, block_rows=block_rows)
        expected = brute_force(x, k)
        assert np.array_equal(ids, expected), (block_rows, k)
        assert np.array_equal(distances, ((x[:, None] - x[expected]) ** 2).sum(axis=2))


def test_neighbours_of_random_data() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(700, 24)).astype(np.float32)
    ids, _ = all_pairs_neighbours(x, 30, block_rows=128)
    assert np.array_equal(ids, brute_force(x, 30))


def test_bad_k_is_refused() -> None:
    with pytest.raises(ValueError, match="between 1 and the 3 other rows"):
        all_pairs_neighbours(np.zeros((4, 2), dtype=np.float32), 4)


@pytest.fixture()
def all_pairs_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The all-pairs search for any size (it applies from SOP-like sizes on)."""
    monkeypatch.setattr(retrieval, "ALL_PAIRS_MIN_WORK", 0)


def test_applies_only_above_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.zeros((100, 8), dtype=np.float32)
    assert not all_pairs_applies(x, 10)
    monkeypatch.setattr(retrieval, "ALL_PAIRS_MIN_WORK", 0)
    assert all_pairs_applies(x, 10) and not all_pairs_applies(x, 100)


@pytest.mark.parametrize("ks", [[1, 2, 8, 30], [1], [3, 120]])
def test_same_results_as_the_faiss_path(
    all_pairs_everywhere: None, monkeypatch: pytest.MonkeyPatch, ks: list[int]
) -> None:
    """Exact (integer) distances: the ranks (exact at any depth, or capped at depth + 1), AP@R and RP of
    the all-pairs path equal the faiss path's, so do the neighbour lists kept for K-means."""
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(260, 5)).astype(np.float32)
    labels = rng.integers(0, 30, size=260)
    labels[:3] = [100, 101, 102]  # lone queries
    task = build_task(labels, None)
    for exact_ranks in (True, False):
        fast = query_results(x, task, ks, 64, exact_ranks=exact_ranks, keep_neighbours=True)
        with monkeypatch.context() as patch:
            patch.setattr(retrieval, "ALL_PAIRS_MIN_WORK", 10**30)
            reference = query_results(x, task, ks, 64, exact_ranks=exact_ranks, keep_neighbours=True)
        assert np.array_equal(fast.first_hit_rank, reference.first_hit_rank)
        assert np.array_equal(fast.ap_at_r, reference.ap_at_r)
        assert np.array_equal(fast.r_precision, reference.r_precision)
        listed = fast.neighbours.ids[task.query_rows]
        assert np.array_equal(listed, reference.neighbours.ids)
    without_map = query_results(x, task, ks, 64, with_map_at_r=False)
    assert without_map.ap_at_r is None and np.array_equal(
        np.minimum(without_map.first_hit_rank, max(ks) + 1), np.minimum(fast.first_hit_rank, max(ks) + 1)
    )


def test_evaluation_unchanged_by_the_all_pairs_path(
    all_pairs_everywhere: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Integer rows (exact distances, many ties): metrics and per-query arrays identical. Continuous rows
    with learner slices (L2-normalised, so rounded): the same metrics too."""
    rng = np.random.default_rng(4)
    exact = rng.integers(-3, 4, size=(300, 6)).astype(np.float32)
    labels = rng.integers(0, 40, size=300)
    continuous = rng.normal(size=(300, 8)).astype(np.float32) + rng.normal(size=(40, 8)).astype(np.float32)[labels]
    slices = np.array([[0, 4], [4, 8]])

    def both() -> list:
        return [
            evaluate_views(exact, labels, [1, 4, 100]),
            evaluate_views(continuous, labels, [1, 4], learner_slices=slices),
        ]

    fast = both()
    fast_recall = recall_at_k(exact, labels, [1, 4])
    monkeypatch.setattr(retrieval, "ALL_PAIRS_MIN_WORK", 10**30)
    reference = both()
    for ours, theirs in zip(fast, reference, strict=True):
        assert ours.metrics == theirs.metrics
        assert ours.per_query.keys() == theirs.per_query.keys()
        assert all(np.array_equal(ours.per_query[key], theirs.per_query[key]) for key in theirs.per_query)
    assert fast_recall == recall_at_k(exact, labels, [1, 4])
