"""Lloyd K-means as faiss runs it, computing only the distances that an iteration can change.

faiss's ``Kmeans`` (``faiss/Clustering.cpp``, the installed 1.15) recomputes every point's distance to
every centroid in every iteration and once more for the final assignment: (iterations + 1) × N × K × d
multiply-adds, the largest part of an evaluation at SOP size. This module runs the same algorithm:

* the same start: the centroids are the rows ``perm[:K]`` of faiss's own ``rand_perm`` with seed
  ``seed + 1 + redo · 15486557``;
* the same update: each centroid is the float32 sum of its points in row order times
  ``1 / count`` (faiss's ``compute_centroids``, bit for bit), and an empty cluster takes half of a
  donor drawn as faiss's ``split_clusters`` draws it (its Mersenne Twister seeded 1234, the donor's
  probability (count − 1) / (N − K), the same ±1/1024 perturbation; bit for bit);
* the same stop: after iteration i > 0 whose objective (the float32 sum, in row order, of the
  points' squared distances to their centroids) equals iteration i − 1's, or after ``niter``
  iterations; with ``nredo`` runs the one of lowest final objective is kept;

but an assignment step only computes what can change. A centroid that did not move (bit for bit)
since the last step keeps its distances, so a point whose own centroid did not move can only leave it
for a centroid that moved: the step computes those points' distances to the moved centroids only, and
the full rows of the points whose centroid moved. In the late iterations few centroids move, and
once none does, the assignment is known without a search (faiss's final search included). The first
assignment, to K starting centroids that are rows of the data, can come from the evaluation's kNN
lists (:func:`first_assignment`): a row's nearest starting centroid is its nearest listed neighbour
among them. So a run costs about one full search (the second iteration's, when nearly every centroid
moves) where faiss's costs (iterations + 1).

Distances are ‖x‖² + (‖c‖² − 2 x·c), as faiss computes them, with numpy's float32 GEMM; the nearest
centroid is the one of smallest ‖c‖² − 2 x·c, the lowest index among equal values. A GEMM rounds a
dot product differently for blocks of other shapes (in the last bits), so a point almost equidistant
from two centroids (to float32 rounding) may be assigned to the other one than a full recomputation,
or faiss, would pick: the result is Lloyd's algorithm up to float32 rounding, as faiss's own is (its
result changes with its block sizes and SIMD path in the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np

from dmlbench.evaluation.retrieval import Neighbours

SPLIT_EPS = np.float32(1.0 / 1024.0)
"""faiss's perturbation of a split centroid (``EPS`` in ``split_clusters``)."""

SPLIT_SEED = 1234
"""Seed of the random generator that ``split_clusters`` creates on every call."""

REDO_SEED_STRIDE = 15486557
"""faiss's seed offset between the runs of ``nredo``."""

BLOCK_BYTES = 16 << 20
"""Bound on one block of point × centroid scores (16 MiB of float32)."""

MIN_BLOCK_ROWS = 64
"""Fewest points per block, whatever the number of centroids."""


@dataclass(frozen=True)
class LloydResult:
    """A K-means clustering as faiss's ``Kmeans`` would leave it.

    Attributes:
        assignment: (N,) int64 index of each point's nearest final centroid (faiss's
            ``index.search(x, 1)`` after ``train``).
        centroids: (K, d) float32 final centroids.
        iterations: iterations counted as faiss counts ``iteration_stats``: the kept run's
            iterations plus those of the runs before it.
        objective: the kept run's last objective.
    """

    assignment: np.ndarray
    centroids: np.ndarray
    iterations: int
    objective: float


def rand_perm(n: int, seed: int) -> np.ndarray:
    """faiss's ``rand_perm``: the permutation of range(n) that faiss's K-means takes its initial centroids from."""
    perm = np.empty(n, dtype=np.int32)
    faiss.rand_perm(faiss.swig_ptr(perm), n, seed)
    return perm.astype(np.int64)


class FaissRandom:
    """The ``rand_float`` stream of faiss's ``RandomGenerator`` (std::mt19937 seeded with ``seed``), drawn in blocks.

    >>> stream = FaissRandom(1234)
    >>> float(stream.take(3)[0]) == faiss.RandomGenerator(1234).rand_float()
    True
    """

    def __init__(self, seed: int) -> None:
        self._bits = np.random.MT19937()
        self._bits._legacy_seeding(seed)  # std::mt19937's seeding (init_genrand)
        self._buffer = np.empty(0, dtype=np.float32)

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` values (consumed only as far as :meth:`give_back` does not return them)."""
        if len(self._buffer) < count:
            raw = self._bits.random_raw(max(count - len(self._buffer), 4096))
            # rand_float() = mt() / float(mt.max()): the draw rounded to float32, divided in float32
            fresh = raw.astype(np.float32) / np.float32(4294967295.0)
            self._buffer = np.concatenate([self._buffer, fresh])
        values, self._buffer = self._buffer[:count], self._buffer[count:]
        return values

    def give_back(self, values: np.ndarray) -> None:
        """Return the unused tail of the last :meth:`take` to the front of the stream."""
        self._buffer = np.concatenate([values, self._buffer])


def split_clusters(centroids: np.ndarray, counts: np.ndarray, num_points: int) -> int:
    """faiss's ``split_clusters``, in place: each empty cluster (in index order) takes a copy of a donor.

    The donor is found by scanning the clusters cyclically from 0, one ``rand_float`` per cluster,
    until one falls below (count − 1) / (N − K); after 10·K tries, the largest cluster. The copy is
    scaled by 1 ± 1/1024 on even / odd coordinates and the donor by the opposite factors; the count is
    halved between them.

    Args:
        centroids: (K, d) float32 means (empty clusters at zero), modified in place.
        counts: (K,) float32 points per cluster, modified in place.
        num_points: N.

    Returns:
        The number of clusters split.
    """
    empty = np.flatnonzero(counts == 0)
    if not len(empty):
        return 0
    k, dim = centroids.shape
    rng = FaissRandom(SPLIT_SEED)
    denominator = np.float64(np.float32(num_points - k))
    probability = ((counts.astype(np.float64) - 1.0) / denominator).astype(np.float32)
    up, down = np.float32(1) + SPLIT_EPS, np.float32(1) - SPLIT_EPS
    even = np.arange(dim) % 2 == 0
    copy_factor, donor_factor = np.where(even, up, down), np.where(even, down, up)
    for ci in empty:
        donor = -1
        for _ in range(10):  # max_tries = 10·K: ten cycles over the clusters
            draws = rng.take(k)
            hits = np.flatnonzero(draws < probability)
            if len(hits):
                donor = int(hits[0])
                rng.give_back(draws[donor + 1 :])
                break
        if donor < 0:
            donor = int(np.argmax(counts))  # faiss's fallback: the first largest cluster
        centroids[ci] = centroids[donor] * copy_factor
        centroids[donor] *= donor_factor
        counts[ci] = counts[donor] / np.float32(2)
        counts[donor] -= counts[ci]
        for cluster in (ci, donor):
            probability[cluster] = np.float32((np.float64(counts[cluster]) - 1.0) / denominator)
    return len(empty)


def sequential_sums(points: np.ndarray, rows: np.ndarray, groups: np.ndarray, num_groups: int) -> np.ndarray:
    """(num_groups, d) float32 sums of ``points[rows]`` by group, each added in the order of ``rows``.

    faiss's ``compute_centroids`` adds a cluster's points one by one in row order, starting from zero;
    so does this, for all groups at once (the i-th point of every group in one step).

    Args:
        points: (N, d) float32.
        rows: (m,) rows of ``points``, increasing.
        groups: (m,) group of each row, in [0, num_groups).
        num_groups: number of groups.
    """
    sums = np.zeros((num_groups, points.shape[1]), dtype=np.float32)
    if not len(rows):
        return sums
    order = np.argsort(groups, kind="stable")  # by group, rows still increasing within a group
    grouped = groups[order]
    first = np.searchsorted(grouped, grouped, side="left")
    rank = np.arange(len(order)) - first  # position of each row within its group
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_rank], np.arange(int(rank.max()) + 2))
    for level in range(len(bounds) - 1):
        step = by_rank[bounds[level] : bounds[level + 1]]  # at most one row per group
        sums[grouped[step]] += points[rows[order[step]]]
    return sums


class Means:
    """The cluster means of ``compute_centroids``, recomputed only for the clusters whose points changed."""

    def __init__(self, points: np.ndarray, num_clusters: int) -> None:
        self.points = points
        self.means = np.zeros((num_clusters, points.shape[1]), dtype=np.float32)
        self.counts = np.zeros(num_clusters, dtype=np.float32)

    def update(self, assignment: np.ndarray, clusters: np.ndarray | None = None) -> None:
        """Recompute the means and counts of ``clusters`` (all when None) for ``assignment``."""
        if clusters is None:
            rows = np.arange(len(assignment))
            clusters = np.arange(len(self.counts))
        else:
            if not len(clusters):
                return
            selected = np.zeros(len(self.counts), dtype=bool)
            selected[clusters] = True
            rows = np.flatnonzero(selected[assignment])
        slot = np.full(len(self.counts), -1, dtype=np.int64)
        slot[clusters] = np.arange(len(clusters))
        groups = slot[assignment[rows]]
        sums = sequential_sums(self.points, rows, groups, len(clusters))
        counts = np.bincount(groups, minlength=len(clusters)).astype(np.float32)
        scale = np.zeros(len(clusters), dtype=np.float32)
        filled = counts > 0
        scale[filled] = np.float32(1) / counts[filled]  # float norm = 1 / hassign[ci]; c[j] *= norm
        self.means[clusters] = sums * scale[:, None]
        self.counts[clusters] = counts

    def centroids(self) -> tuple[np.ndarray, np.ndarray]:
        """(centroids, counts) after ``split_clusters``, as copies (the means stay unsplit)."""
        centroids, counts = self.means.copy(), self.counts.copy()
        split_clusters(centroids, counts, len(self.points))
        return centroids, counts


class Assigner:
    """Nearest-centroid search for the points of one K-means run."""

    def __init__(self, points: np.ndarray) -> None:
        self.points = points
        self.squared_norms = np.einsum("ij,ij->i", points, points)

    def nearest(
        self, rows: np.ndarray | None, centroids: np.ndarray, columns: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(index, squared distance) of the nearest of ``centroids`` (rows ``columns`` of them) for the points.

        Args:
            rows: points to assign (None: all).
            centroids: (K, d) float32.
            columns: the centroids to consider, increasing (None: all); the indices returned are among them.
        """
        subset = centroids if columns is None else centroids[columns]
        scaled = subset * np.float32(-2.0)  # exact: −2 x·c without a pass over the scores
        norms = np.einsum("ij,ij->i", subset, subset)
        count = len(self.points) if rows is None else len(rows)
        nearest = np.empty(count, dtype=np.int64)
        distances = np.empty(count, dtype=np.float32)
        block = max(MIN_BLOCK_ROWS, BLOCK_BYTES // (4 * max(1, len(subset))))
        scores = np.empty((min(block, count), len(subset)), dtype=np.float32)
        for start in range(0, count, block):
            stop = min(start + block, count)
            chosen = slice(start, stop) if rows is None else rows[start:stop]
            part = scores[: stop - start]
            np.matmul(self.points[chosen], scaled.T, out=part)
            part += norms
            best = part.argmin(axis=1)
            nearest[start:stop] = best
            distances[start:stop] = part[np.arange(stop - start), best]
        point_norms = self.squared_norms if rows is None else self.squared_norms[rows]
        distances += point_norms
        np.maximum(distances, 0, out=distances)  # rounding can make a duplicate's distance negative
        if columns is not None:
            nearest = columns[nearest]
        return nearest, distances

    def reassign(
        self, assignment: np.ndarray, distances: np.ndarray, old: np.ndarray, new: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The nearest of the ``new`` centroids for every point, given the assignment to the ``old`` ones.

        Returns:
            (assignment, squared distances, moved): moved is the (K,) mask of the centroids that changed.
        """
        moved = (old != new).any(axis=1)
        if not moved.any():
            return assignment, distances, moved
        assignment, distances = assignment.copy(), distances.copy()
        displaced = np.flatnonzero(moved[assignment])  # their own centroid moved: all their distances change
        settled = np.flatnonzero(~moved[assignment])
        moved_ids = np.flatnonzero(moved)
        num_points, num_clusters = len(assignment), len(moved)
        if len(displaced) * num_clusters + len(settled) * len(moved_ids) >= num_points * num_clusters:
            assignment, distances = self.nearest(None, new)
            return assignment, distances, moved
        if len(displaced):
            assignment[displaced], distances[displaced] = self.nearest(displaced, new)
        if len(settled):
            if 2 * len(settled) > num_points:  # most rows: computing all of them beats gathering these
                candidate, candidate_distance = self.nearest(None, new, moved_ids)
                candidate, candidate_distance = candidate[settled], candidate_distance[settled]
            else:
                candidate, candidate_distance = self.nearest(settled, new, moved_ids)
            current, current_distance = assignment[settled], distances[settled]
            closer = (candidate_distance < current_distance) | (
                (candidate_distance == current_distance) & (candidate < current)
            )
            assignment[settled[closer]] = candidate[closer]
            distances[settled[closer]] = candidate_distance[closer]
        return assignment, distances, moved


def objective(distances: np.ndarray) -> np.float32:
    """faiss's objective: the float32 sum of the distances, added in row order."""
    return np.cumsum(distances, dtype=np.float32)[-1]


def first_assignment(
    assigner: Assigner, centroids: np.ndarray, starts: np.ndarray, neighbours: Neighbours | None
) -> tuple[np.ndarray, np.ndarray]:
    """(nearest centroid, squared distance) of every point for the starting centroids ``points[starts]``.

    With ``neighbours`` (the rows' nearest other rows), a row that is itself a starting centroid takes it
    (at distance 0: the rows are distinct vectors where this runs,
    :func:`~dmlbench.evaluation.clustering.pruned_lloyd_applies`), and a row with a starting centroid among
    its neighbours takes the nearest of them (at its listed distance): no distance to a centroid is
    computed for them. The other rows are searched.
    """
    if neighbours is None:
        return assigner.nearest(None, centroids)
    num_points = len(assigner.points)
    centroid_of = np.full(num_points, -1, dtype=np.int64)
    centroid_of[starts] = np.arange(len(starts))
    assignment = np.full(num_points, -1, dtype=np.int64)
    distances = np.zeros(num_points, dtype=np.float32)
    candidates = centroid_of[neighbours.ids]  # (Q, k): the centroid each neighbour starts, or -1
    found = (candidates >= 0).any(axis=1)
    first = (candidates >= 0).argmax(axis=1)[found]
    rows = neighbours.rows[found]
    assignment[rows] = candidates[found, first]
    distances[rows] = neighbours.distances[found, first]
    assignment[starts] = np.arange(len(starts))  # a starting centroid's own row, at distance 0
    distances[starts] = 0
    rest = np.flatnonzero(assignment < 0)
    if len(rest):
        assignment[rest], distances[rest] = assigner.nearest(rest, centroids)
    return assignment, distances


def lloyd(
    points: np.ndarray, num_clusters: int, niter: int, nredo: int, seed: int, neighbours: Neighbours | None = None
) -> LloydResult:
    """K-means of ``points`` as faiss's ``Kmeans(d, K, niter=, nredo=, seed=)`` (no subsampling) runs it.

    Args:
        points: (N, d) float32, C-contiguous, N > K ≥ 1.
        num_clusters: K.
        niter: most iterations per run.
        nredo: runs; the one of lowest final objective is kept (the first among equals).
        seed: faiss's seed, ≥ 0.
        neighbours: optional nearest other rows of (some) rows, from the kNN search of the evaluation
            (:func:`first_assignment` takes the first assignment from them).
    """
    num_points = len(points)
    if not 1 <= num_clusters < num_points:
        raise ValueError(f"lloyd needs 1 <= K < N, got K = {num_clusters}, N = {num_points}")
    assigner = Assigner(points)
    best: tuple | None = None
    iterations_so_far = 0
    for redo in range(nredo):
        starts = rand_perm(num_points, seed + 1 + redo * REDO_SEED_STRIDE)[:num_clusters]
        centroids = points[starts]
        assignment, distances = first_assignment(assigner, centroids, starts, neighbours)
        means = Means(points, num_clusters)
        means.update(assignment)
        previous_objective = None
        for iteration in range(niter):
            value = objective(distances)
            iterations_so_far += 1
            updated, _ = means.centroids()
            converged = iteration > 0 and previous_objective != 0 and value == previous_objective
            if converged or iteration == niter - 1:
                break
            previous_assignment = assignment
            assignment, distances, _ = assigner.reassign(assignment, distances, centroids, updated)
            centroids = updated
            changed = np.flatnonzero(assignment != previous_assignment)
            means.update(assignment, np.union1d(previous_assignment[changed], assignment[changed]))
            previous_objective = value
        if best is None or value < best[0]:
            best = (value, iterations_so_far, assignment, distances, centroids, updated)
    assert best is not None  # nredo ≥ 1 runs
    value, iterations, assignment, distances, centroids, final = best
    assignment, _, _ = assigner.reassign(assignment, distances, centroids, final)  # faiss's index.search(x, 1)
    return LloydResult(assignment, final, iterations, float(value))
