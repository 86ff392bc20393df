"""Normalised-softmax loss (Zhai & Wu 2019, "Classification is a strong baseline for DML")."""

from __future__ import annotations

from torch import Tensor, nn

from .checks import check_batch, check_fraction, check_labels_in_range, check_positive
from .cross_entropy import smoothed_cross_entropy

__all__ = ["NormalizedSoftmaxLoss"]


class NormalizedSoftmaxLoss(nn.Module):
    """Cross-entropy on cosine logits with L2-normalised class weights.

    ``logits[i, c] = cos(x_i, w_c) / T``; loss = mean cross-entropy, with
    optional label smoothing (see :func:`smoothed_cross_entropy`).
    Zhai & Wu 2019 use T = 0.05 and no label smoothing; the MPN recipe uses
    smoothing 0.1 (REFERENCE.md).

    pytorch-metric-learning's ``NormalizedSoftmaxLoss`` computes exactly
    this for ε = 0 (weights ``W`` of shape (d, C) normalised per class,
    embeddings normalised, dot product / T, ``CrossEntropyLoss`` averaged
    over the batch, no regulariser by default), so it is used: it owns ``W``
    (initialised ``normal(0, 1)``) and computes the ε = 0 loss; for ε > 0 its
    logits go through :func:`smoothed_cross_entropy`. Caveat: PML casts ``W``
    in place to the embeddings' dtype; :func:`check_batch` upcasts half
    precision embeddings to float32 so AMP never turns ``W`` into float16.

    Args:
        num_classes: C.
        embedding_dim: d.
        temperature: T > 0.
        label_smoothing: ε in [0, 1).
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        *,
        temperature: float = 0.05,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        check_positive("temperature", temperature)
        check_fraction("label_smoothing", label_smoothing)
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing
        # imported here: pytorch_metric_learning costs half a second, and every run imports this module
        from pytorch_metric_learning.losses import NormalizedSoftmaxLoss as PMLNormalizedSoftmaxLoss

        self.pml_loss = PMLNormalizedSoftmaxLoss(num_classes, embedding_dim, temperature=temperature)

    @property
    def weight(self) -> Tensor:
        """(d, C) un-normalised class weights."""
        return self.pml_loss.W

    def logits(self, embeddings: Tensor) -> Tensor:
        """(B, d) embeddings -> (B, C) cosine logits divided by T."""
        self.pml_loss.cast_types(embeddings.dtype, embeddings.device)
        return self.pml_loss.get_logits(embeddings)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d), labels (B,) in 0..C-1. Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        check_labels_in_range(labels, self.num_classes)
        if self.label_smoothing == 0.0:
            return self.pml_loss(embeddings, labels)
        return smoothed_cross_entropy(self.logits(embeddings), labels, self.label_smoothing)
