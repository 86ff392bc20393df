"""Normalised-softmax loss (Zhai & Wu 2019, "Classification is a strong baseline for DML")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_fraction, check_labels_in_range, check_positive
from .cross_entropy import smoothed_cross_entropy
from .state_keys import rename_state_keys_on_load

__all__ = ["NormalizedSoftmaxLoss"]


class NormalizedSoftmaxLoss(nn.Module):
    """Cross-entropy on cosine logits with L2-normalised class weights.

    ``logits[i, c] = cos(x_i, w_c) / T``; loss = mean cross-entropy, with
    optional label smoothing (see :func:`smoothed_cross_entropy`).
    Zhai & Wu 2019 use T = 0.05 and no label smoothing; the MPN recipe uses
    smoothing 0.1 (REFERENCE.md).

    The class weights ``weight`` (d, C) are initialised ``normal(0, 1)``, as
    in pytorch-metric-learning's ``NormalizedSoftmaxLoss``, whose loss this
    computes with the same operations in the same order (both the embeddings
    and the normalised weights are normalised once more before the product, a
    no-op up to rounding), so that a run gives the numbers it gave when this
    class wrapped PML's (``tests/test_losses.py`` compares the two bit for bit
    when PML is installed). The weights are cast to the embeddings' dtype for
    the product, never in place (PML cast ``W`` itself): they stay float32,
    and under AMP :func:`check_batch` upcasts half precision embeddings.

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
        self.temperature = temperature
        self.label_smoothing = label_smoothing
        self.weight = nn.Parameter(torch.empty(embedding_dim, num_classes))
        nn.init.normal_(self.weight)
        rename_state_keys_on_load(self, {"pml_loss.W": "weight"})

    def logits(self, embeddings: Tensor) -> Tensor:
        """(B, d) embeddings -> (B, C) cosine logits divided by T."""
        unit_weight = F.normalize(self.weight.to(embeddings.dtype), p=2, dim=0).t()
        cosines = F.normalize(embeddings, p=2, dim=1) @ F.normalize(unit_weight, p=2, dim=1).t()
        return cosines / self.temperature

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d), labels (B,) in 0..C-1. Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        check_labels_in_range(labels, self.num_classes)
        if self.label_smoothing == 0.0:  # the mean of per-sample losses, summed in PML's order
            return F.cross_entropy(self.logits(embeddings), labels, reduction="none").mean()
        return smoothed_cross_entropy(self.logits(embeddings), labels, self.label_smoothing)
