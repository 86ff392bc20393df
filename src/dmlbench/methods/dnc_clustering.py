"""Data grouping for divide-and-conquer: K-means, cluster matching, fixed partitions, per-cluster batches.

Everything here works on per-row arrays of the training set (O(N) memory, no N × N
matrix): ``clusters`` is an (N,) int64 array with the cluster id of each training
row in 0..K-1, or -1 for a row that is left out of every cluster for the current
period (:func:`drop_singleton_classes`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import normalized_mutual_info_score
from torch.utils.data import Sampler

from dmlbench.data.samplers import ClassBalancedBatchSampler
from dmlbench.evaluation.clustering import KMeansSettings, kmeans_assignments

#: id of a row that belongs to no cluster in the current period.
DROPPED = -1


def kmeans_clusters(embeddings: np.ndarray, num_clusters: int, settings: KMeansSettings) -> np.ndarray:
    """faiss K-means (Euclidean, all rows, no subsampling) of the training embeddings.

    Args:
        embeddings: (N, d) float32.
        num_clusters: K ≥ 1.
        settings: seed, iterations and restarts.

    Returns:
        (N,) int64 cluster ids in 0..K-1.
    """
    return kmeans_assignments(np.ascontiguousarray(embeddings, dtype=np.float32), num_clusters, settings).astype(
        np.int64
    )


def overlap_matrix(first: np.ndarray, second: np.ndarray, num_clusters: int) -> np.ndarray:
    """``O[i, j]`` = number of rows in cluster i of ``first`` and cluster j of ``second`` (rows with -1 ignored).

    Args:
        first, second: (N,) int cluster ids of the same rows.

    Returns:
        (K, K) int64.

    >>> overlap_matrix(np.array([0, 0, 1, -1]), np.array([1, 1, 0, 0]), 2)
    array([[0, 2],
           [1, 0]])
    """
    keep = (first >= 0) & (second >= 0)
    flat = first[keep].astype(np.int64) * num_clusters + second[keep]
    return np.bincount(flat, minlength=num_clusters * num_clusters).reshape(num_clusters, num_clusters)


def match_clusters(previous: np.ndarray, current: np.ndarray, num_clusters: int) -> np.ndarray:
    """Relabel ``current`` so that each cluster keeps the id of the previous cluster it overlaps most.

    Paper, appendix A: a linear assignment problem whose similarity between clusters is
    their intersection over union (IoU) of rows, solved with the Hungarian algorithm
    (``scipy.optimize.linear_sum_assignment``, maximising the total IoU). The authors'
    code minimises the L1 distance between membership vectors, ``|A| + |B| − 2|A ∩ B|``,
    instead; summed over a one-to-one matching that is a constant minus twice the total raw
    overlap, which picks a different matching than IoU when cluster sizes differ (tested).

    Args:
        previous: (N,) ids of the last period (-1 ignored).
        current: (N,) ids of the new clustering, 0..K-1.
        num_clusters: K.

    Returns:
        (N,) int64: ``current`` with its ids permuted.

    >>> match_clusters(np.array([0, 0, 1, 1, 2]), np.array([2, 2, 0, 0, 1]), 3)
    array([0, 0, 1, 1, 2])
    """
    overlap = overlap_matrix(current, previous, num_clusters).astype(np.float64)
    sizes_current = np.bincount(current[current >= 0], minlength=num_clusters)
    sizes_previous = np.bincount(previous[previous >= 0], minlength=num_clusters)
    union = sizes_current[:, None] + sizes_previous[None, :] - overlap
    iou = np.divide(overlap, union, out=np.zeros_like(overlap), where=union > 0)
    rows, cols = linear_sum_assignment(iou, maximize=True)
    mapping = np.empty(num_clusters, dtype=np.int64)
    mapping[rows] = cols
    return np.where(current >= 0, mapping[np.maximum(current, 0)], DROPPED).astype(np.int64)


def drop_singleton_classes(clusters: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Mark rows whose class has a single image in their cluster as :data:`DROPPED` (-1).

    Such a row has no positive partner inside its cluster (the authors' code drops them too).

    >>> drop_singleton_classes(np.array([0, 0, 0, 1, 1]), np.array([5, 5, 6, 6, 6]))
    array([ 0,  0, -1,  1,  1])
    """
    clusters = np.asarray(clusters, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    keep = clusters >= 0
    pairs = np.stack([clusters, labels], axis=1)[keep]
    _, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    result = clusters.copy()
    kept_rows = np.flatnonzero(keep)
    result[kept_rows[counts[inverse.ravel()] == 1]] = DROPPED
    return result


def random_partition(num_rows: int, num_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """Rows split uniformly at random into K parts of sizes differing by at most one.

    >>> np.bincount(random_partition(10, 3, np.random.default_rng(0))).tolist()
    [4, 3, 3]
    """
    clusters = np.empty(num_rows, dtype=np.int64)
    clusters[rng.permutation(num_rows)] = np.arange(num_rows) % num_clusters
    return clusters


def pack_groups(row_groups: np.ndarray, num_clusters: int) -> np.ndarray:
    """Assign whole groups to K clusters, balancing rows: largest group first, onto the smallest cluster.

    Deterministic (ties: smaller group id, then smaller cluster id). With as many groups as
    clusters, each group is one cluster.

    Args:
        row_groups: (N,) int group id of each row, 0..G-1.
        num_clusters: K ≤ G.

    Returns:
        (N,) int64 cluster ids.

    Raises:
        ValueError: fewer groups than clusters.

    >>> pack_groups(np.array([0, 0, 0, 1, 1, 2, 2, 3]), 2).tolist()
    [0, 0, 0, 1, 1, 1, 1, 0]
    """
    groups, sizes = np.unique(row_groups, return_counts=True)
    if len(groups) < num_clusters:
        raise ValueError(f"{len(groups)} class groups cannot fill {num_clusters} clusters")
    load = np.zeros(num_clusters, dtype=np.int64)
    cluster_of_group: dict[int, int] = {}
    for g in sorted(range(len(groups)), key=lambda i: (-sizes[i], groups[i])):
        target = int(np.argmin(load))
        cluster_of_group[int(groups[g])] = target
        load[target] += sizes[g]
    return np.array([cluster_of_group[int(g)] for g in row_groups], dtype=np.int64)


# ----------------------------------------------------------------------------- health


#: Health numbers of one grouping (:func:`grouping_health`), in this order (the recipe's state).
GROUPING_HEALTH_KEYS = (
    "cluster_balance",
    "cluster_min_share",
    "cluster_max_share",
    "cluster_class_nmi",
    "cluster_class_nmi_chance",
)


def grouping_health(
    clusters: np.ndarray, labels: np.ndarray, num_clusters: int, rng: np.random.Generator
) -> dict[str, float]:
    """How a grouping of the training rows looks: cluster sizes and cluster–class agreement.

    Args:
        clusters: (N,) cluster ids 0..K-1 of the training rows (before dropping singletons).
        labels: (N,) class labels of the same rows.
        num_clusters: K (an id that no row has counts as an empty cluster).
        rng: draws the label permutation of the chance reference.

    Returns:
        ``cluster_balance``: smallest / largest cluster size (1: equal sizes, 0: an empty cluster);
        ``cluster_min_share`` / ``cluster_max_share``: smallest / largest size divided by N / K;
        ``cluster_class_nmi``: NMI (arithmetic mean normalisation) between clusters and classes;
        ``cluster_class_nmi_chance``: the same NMI after permuting the labels over the rows — what
        a clustering with these sizes that ignores the classes scores (for K ≪ C about
        (K−1)(C−1) / (N (ln K + ln C)), e.g. ≈ 0.015 for K = 4, C = 40, N = 1,600).

    >>> h = grouping_health(np.array([0, 0, 1, 1]), np.array([5, 5, 7, 7]), 2, np.random.default_rng(0))
    >>> h["cluster_balance"], h["cluster_min_share"], h["cluster_class_nmi"]
    (1.0, 1.0, 1.0)
    >>> grouping_health(np.zeros(4, dtype=int), np.array([5, 5, 7, 7]), 2, np.random.default_rng(0))["cluster_balance"]
    0.0
    """
    sizes = np.bincount(clusters, minlength=num_clusters)
    expected = len(clusters) / num_clusters
    return {
        "cluster_balance": float(sizes.min() / sizes.max()),
        "cluster_min_share": float(sizes.min() / expected),
        "cluster_max_share": float(sizes.max() / expected),
        "cluster_class_nmi": _nmi(labels, clusters),
        "cluster_class_nmi_chance": _nmi(rng.permutation(labels), clusters),
    }


def _nmi(labels: np.ndarray, clusters: np.ndarray) -> float:
    return float(normalized_mutual_info_score(labels, clusters, average_method="arithmetic"))


# ----------------------------------------------------------------------------- class groups


def synthetic_class_groups(dataset_config: Mapping[str, Any]) -> pd.DataFrame:
    """``label``, ``group``, ``split`` of every class of the generated ``synthetic`` dataset.

    The group is the generator's class *family* (a prototype and its mutants,
    ``docs/synthetic.md``), rebuilt from the dataset's params without reading any file.
    """
    from dmlbench.data.synthetic import make_class_table

    table = make_class_table(dataset_config)
    return pd.DataFrame({"label": table["label"], "group": table["family"], "split": table["split"]})


def read_class_groups(path: str | Path, column: str) -> pd.DataFrame:
    """A class-grouping CSV: one row per class with ``label`` (the manifest's label), the group
    ``column`` and optionally ``split`` (only ``train`` rows are used then).

    Returns:
        ``label``, ``group`` (and ``split`` when present).

    Raises:
        FileNotFoundError / ValueError: naming the file and the missing column.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: class grouping file not found (methods.<name>.options.class_groups_file)")
    frame = pd.read_csv(path)
    missing = [c for c in ("label", column) if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {missing} (found {list(frame.columns)}); "
            "set methods.<name>.options.class_groups_column to the group column"
        )
    keep = ["label", column] + (["split"] if "split" in frame.columns else [])
    return frame[keep].rename(columns={column: "group"})


def training_class_groups(table: pd.DataFrame, train_classes: np.ndarray) -> np.ndarray:
    """Group id (0..G-1) of each contiguous training label 0..C-1 of a run.

    Args:
        table: ``label``, ``group`` (and optional ``split``) per class, in manifest labels.
        train_classes: (C,) the manifest label of each training label (``RunData.train_classes``).

    Raises:
        ValueError: a training class of the run is missing from the table (it does not describe
            this dataset's 'train' classes).

    >>> table = pd.DataFrame({"label": [7, 3, 5], "group": ["b", "a", "b"]})
    >>> training_class_groups(table, np.array([3, 7])).tolist()
    [0, 1]
    """
    group_of = dict(zip(table["label"].to_numpy().tolist(), table["group"].to_numpy().tolist(), strict=True))
    missing = [int(c) for c in train_classes if int(c) not in group_of]
    if missing:
        raise ValueError(
            f"the class grouping has no group for training classes {missing[:10]}: it does not "
            "describe this dataset's 'train' classes"
        )
    _, ids = np.unique(np.array([group_of[int(c)] for c in train_classes]), return_inverse=True)
    return ids.astype(np.int64)


# ----------------------------------------------------------------------------- batches


class ClusterBatchSampler(Sampler[list[int]]):
    """Each batch is P classes × K images drawn from *one* cluster (paper, Algorithm 1).

    For every batch a cluster is drawn (``uniform``: each usable cluster equally likely, as
    the paper says; ``proportional``: by number of rows), then a class-balanced batch is
    taken from that cluster's rows with :class:`~dmlbench.data.samplers.ClassBalancedBatchSampler`
    (P is lowered to the cluster's class count when it has fewer classes). A cluster with
    fewer than two classes has no negatives and is never drawn. With a single usable
    cluster no cluster is drawn at all, so the batches are exactly those of the plain P × K
    sampler over that cluster's rows.

    Args:
        labels: (N,) training labels.
        clusters: (N,) cluster ids, -1 = left out.
        classes_per_batch, images_per_class: P and K of ``training.sampler``.
        generator: the epoch RNG (every draw comes from it).
        num_batches: batches per epoch (default N_used // (P·K), at least 1).
        weighting: ``uniform`` or ``proportional``.

    Attributes:
        finished_at: ``time.perf_counter()`` when the last batch had been consumed (the
            training loop asked for one more), else None.
    """

    def __init__(
        self,
        labels: np.ndarray,
        clusters: np.ndarray,
        classes_per_batch: int,
        images_per_class: int,
        generator: torch.Generator,
        num_batches: int | None = None,
        weighting: str = "uniform",
    ):
        labels, clusters = np.asarray(labels), np.asarray(clusters)
        ids = np.unique(clusters[clusters >= 0])
        self.rows = {int(c): np.flatnonzero(clusters == c) for c in ids}
        self.rows = {c: r for c, r in self.rows.items() if len(np.unique(labels[r])) >= 2}
        if not self.rows:
            raise ValueError("no cluster holds two classes: cannot draw a batch with negatives")
        used = sum(len(r) for r in self.rows.values())
        self.labels = labels
        self.classes_per_batch = classes_per_batch
        self.images_per_class = images_per_class
        self.generator = generator
        self.num_batches = num_batches or max(1, used // (classes_per_batch * images_per_class))
        if weighting not in ("uniform", "proportional"):
            raise ValueError(f"cluster weighting must be 'uniform' or 'proportional', got {weighting!r}")
        self.weighting = weighting
        self.finished_at: float | None = None

    def __len__(self) -> int:
        return self.num_batches

    def _schedule(self) -> list[int]:
        """Cluster id of each batch of the epoch."""
        ids = list(self.rows)
        if len(ids) == 1:
            return ids * self.num_batches
        weights = torch.tensor(
            [1.0 if self.weighting == "uniform" else float(len(self.rows[c])) for c in ids], dtype=torch.float64
        )
        draws = torch.multinomial(weights, self.num_batches, replacement=True, generator=self.generator)
        return [ids[i] for i in draws.tolist()]

    def __iter__(self) -> Iterator[list[int]]:
        schedule = self._schedule()
        streams = {}
        for c in dict.fromkeys(schedule):
            rows = self.rows[c]
            classes = len(np.unique(self.labels[rows]))
            streams[c] = iter(
                ClassBalancedBatchSampler(
                    self.labels[rows],
                    min(self.classes_per_batch, classes),
                    self.images_per_class,
                    self.generator,
                    num_batches=schedule.count(c),
                )
            )
        for c in schedule:
            yield self.rows[c][next(streams[c])].tolist()
        self.finished_at = time.perf_counter()
