"""Batch samplers: class-balanced P classes × K images."""

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
