"""Contrastive loss (Hadsell, Chopra & LeCun 2006), in the form of ABE eq. 10."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_positive
from .pairwise import label_masks, masked_mean, pairwise_distances, safe_sqrt

__all__ = ["ContrastiveLoss"]


class ContrastiveLoss(nn.Module):
    """Contrastive loss over all pairs of the batch.

    With ``D`` the Euclidean distance and ``y = 1`` for a same-class pair::

        squared=True  (default, ABE eq. 10):  y * D^2 + (1 - y) * [m - D^2]_+
        squared=False (Hadsell et al. 2006):  y * D^2 + (1 - y) * [m - D]_+^2

    averaged over the B(B-1)/2 unordered pairs ``i < j`` (ABE's 1/N: ABE
    writes the sum over all pairs of the training set divided by N; in a
    mini-batch we divide by the number of pairs, so the value does not
    depend on the batch size). Hadsell et al. put a factor 1/2 on both
    terms, which only rescales the loss by 2 and is dropped here.

    Sources / differences:
        * ABE (Kim et al. 2018, eq. 10) and REFERENCE.md: margin m = 1 on the
          squared distance. DIABLO §3.5 uses a contrastive margin 0.5.
        * pytorch-metric-learning's ``ContrastiveLoss`` (with
          ``LpDistance(power=2)``, ``pos_margin=0``, ``neg_margin=m``) has the
          same per-pair terms for ``squared=True``, but its default reducer
          (``AvgNonZeroReducer``) averages the *non-zero* positive terms and
          the *non-zero* negative terms separately and sums the two means;
          that is not ABE's mean over all pairs. It has no squared hinge
          ``[m - D]_+^2`` (Hadsell form). Hence not used.

    A batch of a single sample has no pair: the loss is 0 (with a grad_fn).
    A batch with no positive pair is *not* zero: it is the mean of the
    negative terms over all pairs.

    Args:
        margin: m > 0.
        squared: put the margin on the squared distance (ABE) rather than on
            the distance (Hadsell).
    """

    def __init__(self, *, margin: float = 1.0, squared: bool = True) -> None:
        super().__init__()
        check_positive("margin", margin)
        self.margin = margin
        self.squared = squared

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d) L2-normalised, labels (B,). Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        d2 = pairwise_distances(embeddings, squared=True)
        positive, negative = label_masks(labels)
        if self.squared:
            negative_term = F.relu(self.margin - d2)
        else:
            negative_term = F.relu(self.margin - safe_sqrt(d2)).pow(2)
        per_pair = torch.where(positive, d2, torch.where(negative, negative_term, 0.0))
        upper = torch.ones_like(positive).triu(diagonal=1)
        return masked_mean(per_pair, upper)
