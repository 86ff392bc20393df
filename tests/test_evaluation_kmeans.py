"""The NMI's K-means (dmlbench.evaluation.kmeans): faiss's algorithm computing only what can change.

Checked against faiss itself (assignments, centroids and iteration counts bit for bit), against
brute-force references in float64, and through evaluate_embeddings: the NMI is the same whichever
K-means runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import faiss
import numpy as np
import pytest

from dmlbench.evaluation import KMeansSettings, clustering, evaluate_embeddings, evaluate_file
from dmlbench.evaluation.clustering import has_duplicate_rows, kmeans_fit_for_nmi, pruned_lloyd_applies
from dmlbench.evaluation.kmeans import (
    Assigner,
    FaissRandom,
    Means,
    first_assignment,
    lloyd,
    rand_perm,
    sequential_sums,
    split_clusters,
)
from dmlbench.evaluation.knn import faiss_threads
from dmlbench.evaluation.retrieval import Neighbours, build_task, query_results
from dmlbench.evaluation.timing import phase, record_phases


@pytest.fixture(autouse=True)
def single_faiss_thread() -> Iterator[None]:
    """One faiss thread: on these small inputs OpenMP start-up costs more than the work."""
    with faiss_threads(1):
        yield


def blobs(num_points: int, num_classes: int, dim: int, seed: int, spread: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs, (N, d) float32 and (N,) labels; every row a distinct vector."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_points)
    x = rng.normal(size=(num_classes, dim))[labels] + spread * rng.normal(size=(num_points, dim))
    return x.astype(np.float32), labels


def faiss_kmeans(x: np.ndarray, k: int, niter: int, nredo: int, seed: int) -> tuple[np.ndarray, faiss.Kmeans]:
    """faiss's K-means with the project's settings and its final assignment (``index.search(x, 1)``)."""
    kmeans = faiss.Kmeans(
        x.shape[1],
        k,
        niter=niter,
        nredo=nredo,
        seed=seed,
        verbose=False,
        max_points_per_centroid=math.ceil(len(x) / k) + 1,
        min_points_per_centroid=1,
    )
    kmeans.train(x)
    return kmeans.index.search(x, 1)[1][:, 0], kmeans


def brute_nearest(x: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest centroid and squared distance in float64 (the reference of the float32 search)."""
    distances = ((x[:, None, :].astype(np.float64) - centroids[None, :, :]) ** 2).sum(axis=2)
    nearest = distances.argmin(axis=1)
    return nearest, distances[np.arange(len(x)), nearest]


# ------------------------------------------------------------------ the pieces, bit for bit


def test_random_stream_and_permutation_are_faiss_own() -> None:
    generator = faiss.RandomGenerator(1234)
    expected = np.array([generator.rand_float() for _ in range(20_000)], dtype=np.float32)
    stream = FaissRandom(1234)
    head = stream.take(7)
    stream.give_back(head[3:])  # what is given back comes again, in order
    assert np.array_equal(np.concatenate([head[:3], stream.take(20_000 - 3)]), expected)
    x = np.arange(40, dtype=np.float32)[:, None]  # faiss starts from rows perm[:K] of its rand_perm
    kmeans = faiss.Kmeans(1, 5, niter=0, seed=11, max_points_per_centroid=9, min_points_per_centroid=1)
    kmeans.train(x)
    assert np.array_equal(kmeans.centroids[:, 0], rand_perm(40, 12)[:5].astype(np.float32))


def test_sequential_sums_add_in_row_order() -> None:
    rng = np.random.default_rng(0)
    points = (rng.normal(size=(300, 5)) * 10.0 ** rng.integers(-4, 5, size=(300, 1))).astype(np.float32)
    rows = np.sort(rng.choice(300, 200, replace=False))
    groups = rng.integers(0, 17, 200)
    expected = np.zeros((17, 5), dtype=np.float32)
    for row, group in zip(rows, groups, strict=True):  # faiss's loop: c[j] += x[j], point after point
        expected[group] += points[row]
    assert np.array_equal(sequential_sums(points, rows, groups, 17), expected)


def test_update_and_split_match_one_faiss_iteration() -> None:
    """One faiss iteration from given centroids, ten of them far from every point: ten empty clusters
    are split by faiss's random draws; the centroids agree bit for bit."""
    x, _ = blobs(900, 30, 6, seed=1)
    rng = np.random.default_rng(2)
    start = np.concatenate([x[rng.choice(900, 30, replace=False)], 1e3 + rng.normal(size=(10, 6))]).astype(np.float32)
    kmeans = faiss.Kmeans(6, 40, niter=1, seed=0, max_points_per_centroid=100, min_points_per_centroid=1)
    kmeans.train(x, init_centroids=start.copy())
    index = faiss.IndexFlatL2(6)
    index.add(start)
    assignment = index.search(x, 1)[1][:, 0]
    means = Means(x, 40)
    means.update(assignment)
    assert (means.counts == 0).sum() == 10
    centroids, counts = means.centroids()
    assert np.array_equal(centroids, kmeans.centroids)
    assert counts.sum() == 900 and (counts > 0).all()


def test_split_falls_back_to_the_largest_cluster() -> None:
    """A donor needs count > 1: with every other cluster of one point, no draw succeeds in 10·K tries."""
    centroids = np.arange(8, dtype=np.float32).reshape(4, 2)
    counts = np.array([1, 0, 1, 1], dtype=np.float32)
    assert split_clusters(centroids, counts, num_points=5) == 1
    assert counts.tolist() == [0.5, 0.5, 1, 1]  # the first largest (cluster 0) shares its count
    up, down = 1 + 1 / 1024, 1 - 1 / 1024
    assert centroids[1].tolist() == [np.float32(0 * up), np.float32(np.float32(1) * np.float32(down))]


def test_incremental_means_equal_a_full_update() -> None:
    x, _ = blobs(500, 12, 4, seed=3)
    rng = np.random.default_rng(4)
    before = rng.integers(0, 40, 500)
    after = before.copy()
    moved = rng.choice(500, 30, replace=False)
    after[moved] = rng.integers(0, 40, 30)
    incremental = Means(x, 40)
    incremental.update(before)
    incremental.update(after, np.union1d(before[moved], after[moved]))
    full = Means(x, 40)
    full.update(after)
    assert np.array_equal(incremental.means, full.means) and np.array_equal(incremental.counts, full.counts)


def test_reassign_equals_a_full_search() -> None:
    """Moving some centroids: the points' nearest centroids are those of a search over all of them."""
    x, _ = blobs(3000, 50, 16, seed=5, spread=1.0)
    rng = np.random.default_rng(6)
    old = x[rng.choice(3000, 200, replace=False)].copy()
    assigner = Assigner(x)
    assignment, distances = assigner.nearest(None, old)
    assert np.array_equal(assignment, brute_nearest(x, old)[0])
    for share in (0.02, 0.3, 1.0):  # few moved (pruned), many, all (a full search)
        new = old.copy()
        moved = rng.choice(200, int(share * 200), replace=False)
        new[moved] += 0.5 * rng.normal(size=(len(moved), 16)).astype(np.float32)
        pruned, pruned_distances, moved_mask = assigner.reassign(assignment, distances, old, new)
        reference, reference_distances = brute_nearest(x, new)
        assert np.array_equal(np.flatnonzero(moved_mask), np.sort(moved))
        assert np.array_equal(pruned, reference)
        np.testing.assert_allclose(pruned_distances, reference_distances, rtol=1e-4, atol=1e-4)


def test_first_assignment_from_neighbour_lists() -> None:
    """With each row's nearest other rows, the starting assignment needs no search where a starting
    centroid is among them; rows without one (and rows not listed) are searched."""
    x, labels = blobs(1200, 40, 8, seed=7)
    starts = rand_perm(1200, 1)[:150]
    centroids = x[starts]
    assigner = Assigner(x)
    reference = brute_nearest(x, centroids)[0]
    distances = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(distances, np.inf)
    order = np.argsort(distances, axis=1, kind="stable")
    listed = np.flatnonzero(labels != 0)  # the rows of class 0 have no list (lone queries, say)
    for k in (1, 3, 60):
        nearest = order[listed, :k]
        neighbours = Neighbours(listed, nearest, distances[listed[:, None], nearest].astype(np.float32))
        assignment, found = first_assignment(assigner, centroids, starts, neighbours)
        assert np.array_equal(assignment, reference), k
        np.testing.assert_allclose(found, brute_nearest(x, centroids)[1], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ whole runs against faiss


@pytest.mark.parametrize(
    ("num_points", "num_clusters", "dim", "niter", "nredo", "seed"),
    [
        (2000, 300, 32, 100, 1, 0),  # to its fixed point
        (2000, 300, 32, 3, 1, 5),  # stopped by the ceiling
        (1500, 100, 8, 25, 3, 9),  # three runs, the best kept
        (3000, 600, 64, 100, 1, 2),  # about five points a cluster, as in retrieval data
        (800, 1, 4, 10, 1, 0),  # one cluster
    ],
)
def test_lloyd_is_faiss_kmeans(num_points: int, num_clusters: int, dim: int, niter: int, nredo: int, seed: int) -> None:
    x, _ = blobs(num_points, max(num_clusters, 2), dim, seed=seed, spread=1.2)
    expected, kmeans = faiss_kmeans(x, num_clusters, niter, nredo, seed)
    result = lloyd(x, num_clusters, niter, nredo, seed)
    assert result.iterations == len(kmeans.iteration_stats)
    assert np.array_equal(result.centroids, kmeans.centroids)
    assert np.array_equal(result.assignment, expected)


def test_lloyd_with_neighbour_lists_is_the_same_run() -> None:
    x, labels = blobs(3000, 500, 32, seed=4, spread=1.0)
    task = build_task(labels, None)
    neighbours = query_results(x, task, [1, 10], 4096, keep_neighbours=True).neighbours
    assert neighbours.ids.shape == (len(task.query_rows), max(10, task.relevant_counts.max()))
    plain = lloyd(x, 500, 100, 2, 3)
    listed = lloyd(x, 500, 100, 2, 3, neighbours)
    assert listed.iterations == plain.iterations and np.array_equal(listed.assignment, plain.assignment)
    assert (
        query_results(x, build_task(labels, np.arange(3000) % 2 == 1), [1], 64, keep_neighbours=True).neighbours is None
    )  # only all-vs-all lists serve K-means


# ------------------------------------------------------------------ which K-means the NMI runs


def test_duplicate_rows_are_found() -> None:
    x, _ = blobs(500, 5, 7, seed=0)
    assert not has_duplicate_rows(x)
    x[321] = x[17]
    assert has_duplicate_rows(x)


def test_the_nmi_runs_faiss_below_the_threshold_and_on_duplicates(monkeypatch: pytest.MonkeyPatch) -> None:
    x, _ = blobs(400, 10, 8, seed=1)
    assert not pruned_lloyd_applies(x, 10)  # small: faiss, bit for bit as before
    monkeypatch.setattr(clustering, "PRUNED_LLOYD_MIN_WORK", 0)
    assert pruned_lloyd_applies(x, 10) and not pruned_lloyd_applies(x, 400)
    x[5] = x[6]
    assert not pruned_lloyd_applies(x, 10)  # exact ties: faiss breaks them in its own order


def test_nmi_and_iterations_the_same_with_either_kmeans(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    x, labels = blobs(2500, 400, 24, seed=8, spread=1.1)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    slices = np.array([[0, 12], [12, 24]])
    settings = KMeansSettings(seed=4, niter=100)
    with_faiss = evaluate_embeddings(x, labels, [1, 4], learner_slices=slices, kmeans=settings)
    monkeypatch.setattr(clustering, "PRUNED_LLOYD_MIN_WORK", 0)
    fit = kmeans_fit_for_nmi(x, 400, settings)
    assert np.array_equal(fit.assignment, faiss_kmeans(x, 400, 100, 1, 4)[0])
    with_lloyd = evaluate_embeddings(x, labels, [1, 4], learner_slices=slices, kmeans=settings)
    assert with_lloyd == with_faiss
    assert with_faiss["kmeans_iterations"] > 2  # the runs did iterate


def test_phase_times_are_recorded_without_changing_results(tmp_path) -> None:
    x, labels = blobs(600, 40, 8, seed=2)
    npz = tmp_path / "e.npz"
    np.savez(npz, embeddings=x, labels=labels)
    plain = evaluate_file(npz, tmp_path / "a.json", [1, 2], per_query_path=tmp_path / "a.npz")
    with record_phases() as times:
        timed = evaluate_file(npz, tmp_path / "b.json", [1, 2], per_query_path=tmp_path / "b.npz")
        with phase("outside"):
            pass
    assert timed == plain and (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert {
        "read embeddings",
        "checks",
        "kNN search",
        "K-means",
        "NMI score",
        "per-query file",
        "metrics file",
        "outside",
    } <= set(times)
    assert all(entry["wall"] >= 0 and entry["cpu"] >= 0 for entry in times.values())
    with phase("unrecorded"):  # no recorder: nothing kept
        pass
    assert "unrecorded" not in times


def test_nmi_is_scikit_learns_to_the_last_bit() -> None:
    from sklearn.metrics import normalized_mutual_info_score

    from dmlbench.evaluation.clustering import normalized_mutual_info

    rng = np.random.default_rng(0)
    cases = [
        (np.zeros(5, int), np.zeros(5, int)),
        (np.zeros(5, int), np.arange(5)),
        (np.arange(6), np.arange(6)[::-1]),
        (np.array([0, 0, 1, 1]), np.array([7, 7, 7, 7])),
        (np.array([3, 3, 9, 9, 9]), np.array([1, 2, 1, 2, 1])),
    ]
    for size, classes, clusters in [(50, 5, 7), (500, 100, 100), (3000, 600, 580), (20000, 3000, 3000), (40, 40, 2)]:
        labels = rng.integers(0, classes, size) * 3 - 7  # any integers, not 0..C-1
        cases.append((labels, rng.integers(0, clusters, size)))
        noisy = labels.copy()
        noisy[rng.random(size) < 0.3] = 1000
        cases.append((labels, noisy))  # correlated
    for labels, clusters in cases:
        expected = normalized_mutual_info_score(labels, clusters, average_method="arithmetic")
        assert normalized_mutual_info(labels, clusters) == expected, (labels[:5], clusters[:5])
