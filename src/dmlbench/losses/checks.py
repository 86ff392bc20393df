"""Input and hyperparameter validation shared by the losses."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_batch", "check_labels_in_range", "check_positive", "check_fraction"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def check_batch(embeddings: Tensor, labels: Tensor) -> Tensor:
    """Validate a batch and return the embeddings in a loss-safe precision.

    Args:
        embeddings: (B, d) floating point embeddings, B >= 1.
        labels: (B,) integer class labels.

    Returns:
        The embeddings, upcast to float32 when they are float16/bfloat16 (the
        exponentials and logarithms of the losses are computed in at least
        float32; float32/float64 inputs are returned unchanged).

    Raises:
        ValueError: on wrong ranks, mismatched batch sizes, an empty batch or
            non-integer labels.
    """
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must have shape (B, d), got {tuple(embeddings.shape)}")
    if labels.ndim != 1:
        raise ValueError(f"labels must have shape (B,), got {tuple(labels.shape)}")
    if labels.shape[0] != embeddings.shape[0]:
        raise ValueError(
            f"labels/embeddings batch size mismatch: {labels.shape[0]} labels for {embeddings.shape[0]} embeddings"
        )
    if embeddings.shape[0] == 0:
        raise ValueError("empty batch")
    if not embeddings.is_floating_point():
        raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {labels.dtype}")
    if embeddings.dtype in _LOW_PRECISION:
        return embeddings.float()
    return embeddings


def check_labels_in_range(labels: Tensor, num_classes: int) -> None:
    """Raise ValueError unless every label lies in 0..num_classes-1.

    Args:
        labels: (B,) integer labels, B >= 1.
        num_classes: number of classes the loss owns parameters for.
    """
    low, high = (int(v) for v in torch.aminmax(labels))
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"labels must lie in [0, {num_classes - 1}] (contiguous training labels), got values in [{low}, {high}]"
        )


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    """Raise ValueError naming the hyperparameter unless value > 0 (or >= 0)."""
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"hyperparameter {name!r} must be {bound}, got {value}")


def check_fraction(name: str, value: float) -> None:
    """Raise ValueError naming the hyperparameter unless 0 <= value < 1."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"hyperparameter {name!r} must be in [0, 1), got {value}")
