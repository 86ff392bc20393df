"""Triplet loss with semi-hard negative mining (Schroff et al. 2015, FaceNet)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_positive
from .pairwise import label_masks, masked_mean, pairwise_distances

__all__ = ["SemiHardTripletLoss", "semihard_negative_distances"]


def semihard_negative_distances(distances: Tensor, labels: Tensor) -> Tensor:
    """Distance to the semi-hard negative of every anchor-positive pair.

    For the pair (a, p) the negative is the one with the smallest ``d(a, n)``
    among those with ``d(a, n) > d(a, p)`` ("negatives_outside"); if there is
    none, the one with the largest ``d(a, n)`` ("negatives_inside").

    Args:
        distances: (B, B) distance matrix.
        labels: (B,) integer labels.

    Returns:
        (B, B) matrix ``D_an[a, p]``; meaningful where (a, p) is a positive
        pair and a has a negative in the batch (it is -inf for anchors
        without negatives).
    """
    _, negative = label_masks(labels)
    # outside[a, p, n]: n is a negative of a farther from a than p is.
    outside = negative.unsqueeze(1) & (distances.unsqueeze(1) > distances.unsqueeze(2))
    d_an = distances.unsqueeze(1).expand_as(outside)
    negatives_outside = d_an.masked_fill(~outside, float("inf")).amin(dim=2)
    negatives_inside = distances.masked_fill(~negative, float("-inf")).amax(dim=1, keepdim=True)
    return torch.where(outside.any(dim=2), negatives_outside, negatives_inside)


class SemiHardTripletLoss(nn.Module):
    """Triplet loss with FaceNet's semi-hard negatives, as TensorFlow computes it.

    For every ordered anchor-positive pair (a, p), a != p, one negative is
    chosen by :func:`semihard_negative_distances` and the loss is::

        mean over (a, p) of [d(a, p) - d(a, n) + margin]_+

    (the mean includes the pairs whose hinge is 0), exactly as
    ``tf.contrib.losses.metric_learning.triplet_semihard_loss`` (TF 1.x) /
    ``tfa.losses.triplet_semihard_loss``.

    Distances: FaceNet (eq. 1), the D&C paper (eq. 2) and the TF 1.x
    ``contrib`` function used by Oh Song et al. 2017 (the "Triplet semihard"
    baseline D&C cites) all use the *squared* Euclidean distance, so
    ``squared=True`` is the default; ``squared=False`` gives TensorFlow
    Addons' default ``distance_metric="L2"`` (plain Euclidean distance). The
    selection of the negative is the same for both (it only compares
    distances); the loss values and the meaning of the margin differ.
    Margin 0.2: FaceNet, D&C §4, REFERENCE.md (DIABLO uses 0.1).

    Difference from TF (degenerate batches only): TF keeps positive pairs
    whose anchor has no negative in the batch, with a "negative" at distance
    0 (loss = margin + d(a, p)); here those pairs are dropped. A batch with
    no such valid pair (e.g. no positive pair) gives 0 with a grad_fn.

    pytorch-metric-learning: ``TripletMarginMiner(type_of_triplets="semihard")``
    keeps *all* triplets with ``0 < d(a,n) - d(a,p) <= margin`` (no single
    negative per pair, no fallback to the hardest-inside negative) and
    ``TripletMarginLoss`` averages only the non-zero triplets; hence not used.

    Args:
        margin: α > 0.
        squared: use squared Euclidean distances.
    """

    def __init__(self, *, margin: float = 0.2, squared: bool = True) -> None:
        super().__init__()
        check_positive("margin", margin)
        self.margin = margin
        self.squared = squared

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d) L2-normalised, labels (B,). Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        distances = pairwise_distances(embeddings, squared=self.squared)
        positive, negative = label_masks(labels)
        valid = positive & negative.any(dim=1, keepdim=True)
        d_an = semihard_negative_distances(distances, labels)
        return masked_mean(F.relu(distances - d_an + self.margin), valid)
