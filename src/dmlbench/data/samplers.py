"""Batch samplers: class-balanced P classes × K images; anchors with a positive or negative partner (ABE)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler


class ClassBalancedBatchSampler(Sampler[list[int]]):
    """Batches of ``classes_per_batch`` (P) distinct classes × ``images_per_class`` (K) images.

    Each epoch walks through a random permutation of the classes, P at a time
    (classes are reused in a fresh permutation once exhausted), and takes K
    images of each class without replacement (with replacement only for a
    class that has fewer than K images). An epoch has ``num_batches`` batches,
    by default ``len(labels) // (P * K)``, so one epoch sees about as many
    images as the training set holds.

    Randomness comes only from ``generator``; re-seed it per epoch (the
    trainer does) and the batch order is a pure function of the seed.

    Args:
        labels: (N,) integer labels of the dataset rows.
        classes_per_batch: P ≥ 2.
        images_per_class: K ≥ 2 (pair- and triplet-based losses need positives).
        generator: torch RNG used for all draws.
        num_batches: batches per epoch, default ``N // (P*K)`` (at least 1).

    >>> labels = np.repeat(np.arange(4), 3)
    >>> sampler = ClassBalancedBatchSampler(labels, 2, 2, torch.Generator().manual_seed(0))
    >>> batch = next(iter(sampler))
    >>> len(batch), len(set(labels[batch]))
    (4, 2)
    """

    def __init__(
        self,
        labels: np.ndarray,
        classes_per_batch: int,
        images_per_class: int,
        generator: torch.Generator,
        num_batches: int | None = None,
    ):
        labels = np.asarray(labels)
        classes = np.unique(labels)
        if classes_per_batch < 2 or images_per_class < 2:
            raise ValueError(
                f"training.sampler needs classes_per_batch ≥ 2 and images_per_class ≥ 2, "
                f"got {classes_per_batch} × {images_per_class}"
            )
        if classes_per_batch > len(classes):
            raise ValueError(
                f"training.sampler.classes_per_batch={classes_per_batch} but the training split "
                f"has only {len(classes)} classes"
            )
        self.rows_by_class = [np.flatnonzero(labels == c) for c in classes]
        self.classes_per_batch = classes_per_batch
        self.images_per_class = images_per_class
        self.generator = generator
        self.num_batches = num_batches or max(1, len(labels) // (classes_per_batch * images_per_class))

    def __len__(self) -> int:
        return self.num_batches

    def _class_stream(self) -> Iterator[int]:
        while True:
            yield from torch.randperm(len(self.rows_by_class), generator=self.generator).tolist()

    def _draw(self, rows: np.ndarray) -> list[int]:
        k = self.images_per_class
        if len(rows) >= k:
            picked = torch.randperm(len(rows), generator=self.generator)[:k]
        else:
            picked = torch.randint(len(rows), (k,), generator=self.generator)
        return rows[picked.numpy()].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        stream = self._class_stream()
        for _ in range(self.num_batches):
            chosen: list[int] = []
            while len(chosen) < self.classes_per_batch:
                c = next(stream)
                if c not in chosen:
                    chosen.append(c)
            yield [row for c in chosen for row in self._draw(self.rows_by_class[c])]


class PairBatchSampler(Sampler[list[int]]):
    """The paper's batches (§4): n anchors, a positive partner for the first n/2, a negative for the rest.

    A batch is ``[a_1 … a_n, b_1 … b_n]`` with b_i the partner of a_i. Anchors are taken in turn
    from random permutations of all training rows; a positive partner is another row of the
    anchor's class (uniformly), a negative partner a row of any other class (uniformly over rows).

    Args:
        labels: (N,) training labels; every class needs ≥ 2 rows and there must be ≥ 2 classes.
        anchors: n, even.
        generator: the epoch's RNG (every draw comes from it).
        num_batches: batches per epoch (default N // (2n), at least 1).

    >>> labels = np.repeat(np.arange(3), 2)
    >>> batch = next(iter(PairBatchSampler(labels, 2, torch.Generator().manual_seed(0))))
    >>> len(batch), bool(labels[batch[0]] == labels[batch[2]]), bool(labels[batch[1]] != labels[batch[3]])
    (4, True, True)
    """

    def __init__(self, labels: np.ndarray, anchors: int, generator: torch.Generator, num_batches: int | None = None):
        labels = np.asarray(labels)
        classes, counts = np.unique(labels, return_counts=True)
        if len(classes) < 2 or counts.min() < 2:
            raise ValueError(
                "methods.<m>.options.batches = 'pairs' needs ≥ 2 training classes with ≥ 2 images each, got "
                f"{len(classes)} classes, the smallest with {counts.min()} image(s); use batches: class_balanced"
            )
        self.labels = labels
        self.order = np.argsort(labels, kind="stable")  # rows grouped by class
        self.class_index = np.searchsorted(classes, labels)  # (N,) class position of each row
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]])  # first position of each class in `order`
        self.counts = counts
        self.position = np.empty(len(labels), dtype=np.int64)  # position of each row within its class
        self.position[self.order] = np.arange(len(labels)) - np.repeat(self.starts, counts)
        self.anchors = anchors
        self.generator = generator
        self.num_batches = num_batches or max(1, len(labels) // (2 * anchors))

    def __len__(self) -> int:
        return self.num_batches

    def _anchor_stream(self) -> Iterator[int]:
        while True:
            yield from torch.randperm(len(self.labels), generator=self.generator).tolist()

    def _uniform(self, high: np.ndarray) -> np.ndarray:
        """One integer in [0, high_i) per entry, from the generator."""
        draws = torch.rand(len(high), generator=self.generator, dtype=torch.float64).numpy()
        return np.minimum((draws * high).astype(np.int64), high - 1)

    def partners(self, anchors: np.ndarray) -> np.ndarray:
        """Positive partners for the first half of ``anchors`` (rows), negative ones for the second."""
        half = len(anchors) // 2
        cls = self.class_index[anchors]
        # positive: another position of the same class (skip the anchor's own position)
        positive = self._uniform(self.counts[cls[:half]] - 1)
        positive += positive >= self.position[anchors[:half]]
        positive_rows = self.order[self.starts[cls[:half]] + positive]
        # negative: a position outside the anchor's class block of `order`
        negative = self._uniform(len(self.labels) - self.counts[cls[half:]])
        negative += np.where(negative >= self.starts[cls[half:]], self.counts[cls[half:]], 0)
        negative_rows = self.order[negative]
        return np.concatenate([positive_rows, negative_rows])

    def __iter__(self) -> Iterator[list[int]]:
        stream = self._anchor_stream()
        for _ in range(self.num_batches):
            anchors = np.array([next(stream) for _ in range(self.anchors)], dtype=np.int64)
            yield [*anchors.tolist(), *self.partners(anchors).tolist()]
