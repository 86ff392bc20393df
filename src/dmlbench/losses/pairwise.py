"""Pairwise distances, label masks and reductions shared by the pair losses.

Everything here is vectorised over the batch: (B, B) matrices, no Python loops
over pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "squared_distances",
    "pairwise_distances",
    "safe_sqrt",
    "label_masks",
    "masked_mean",
    "zero_loss",
]


def squared_distances(x: Tensor, y: Tensor) -> Tensor:
    """Squared Euclidean distances between two sets of vectors.

    Args:
        x: (N, d).
        y: (M, d).

    Returns:
        (N, M) matrix of ``||x_i - y_j||^2``, clamped at 0 against rounding.
    """
    d2 = x.pow(2).sum(1, keepdim=True) + y.pow(2).sum(1).unsqueeze(0) - 2.0 * (x @ y.T)
    return d2.clamp_min(0.0)


def safe_sqrt(x: Tensor) -> Tensor:
    """Element-wise square root of a non-negative tensor with a zero gradient at 0.

    Plain ``sqrt`` has an infinite derivative at 0 (self-distances, duplicate
    embeddings); like TensorFlow's ``pairwise_distance`` we return exactly 0
    there and propagate no gradient through those entries.
    """
    positive = x > 0
    root = x.clamp_min(torch.finfo(x.dtype).tiny).sqrt()
    return torch.where(positive, root, torch.zeros_like(root))


def pairwise_distances(embeddings: Tensor, *, squared: bool = False) -> Tensor:
    """Euclidean distance matrix of a batch.

    Args:
        embeddings: (B, d).
        squared: return squared distances instead of distances.

    Returns:
        (B, B) symmetric matrix with an exact zero diagonal.
    """
    d2 = squared_distances(embeddings, embeddings)
    eye = torch.eye(d2.shape[0], dtype=torch.bool, device=d2.device)
    d2 = d2.masked_fill(eye, 0.0)
    return d2 if squared else safe_sqrt(d2)


def label_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """Positive and negative pair masks of a batch.

    Args:
        labels: (B,) integer labels.

    Returns:
        ``(positive, negative)``, two (B, B) bool matrices: ``positive[i, j]``
        iff ``i != j`` and the labels agree, ``negative[i, j]`` iff they differ.
    """
    same = labels.unsqueeze(0) == labels.unsqueeze(1)
    eye = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~eye, ~same


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is True.

    Args:
        values: tensor of any shape.
        mask: bool tensor of the same shape.

    Returns:
        Scalar. With an empty mask it is 0 and still carries ``values``'s
        ``grad_fn`` (masked entries may be inf/NaN: they are never read).
    """
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return total / mask.sum().clamp_min(1)


def zero_loss(embeddings: Tensor) -> Tensor:
    """A scalar 0 connected to the graph: ``0 * embeddings.sum()``.

    Returned by losses whose batch holds no valid tuple, so that
    ``loss.backward()`` still works (and gives zero gradients).
    """
    return embeddings.sum() * 0.0
