"""Proxy-NCA loss (Movshovitz-Attias et al. 2017, "No fuss distance metric learning using proxies")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_labels_in_range, check_positive
from .pairwise import squared_distances

__all__ = ["ProxyNCALoss"]


class ProxyNCALoss(nn.Module):
    """Proxy-NCA with one learnable proxy per class.

    With ``x̂ = s·x/||x||``, ``p̂_c = s·p_c/||p_c||`` and the squared Euclidean
    distance ``d(x, c) = ||x̂ - p̂_c||^2``::

        loss = mean over the batch of  -log( exp(-d(x, y)) / Σ_{z != y} exp(-d(x, z)) )
             = mean of  d(x, y) + logsumexp_{z != y}(-d(x, z))

    The positive proxy is *excluded* from the denominator, as in the paper
    (eq. in §3.2, the NCA form of Goldberger et al.); the loss can therefore
    be negative. Requires at least two classes.

    Scale s = 3: the Proxy-NCA code of the D&C authors (dichotomies/proxy-nca)
    normalises and scales embeddings and proxies (``scaling_x``,
    ``scaling_p``; its training scripts use 3 for both, the class default is
    x: 1, p: 3); with unit vectors this multiplies the distances by s^2 = 9.
    That code also differs from the paper: it *includes* the positive in the
    softmax and uses label smoothing 0.1 spread over the other classes.

    pytorch-metric-learning's ``ProxyNCALoss`` differs from the paper too:
    it is a softmax over *all* proxies (positive included in the
    denominator), its ``softmax_scale`` multiplies the distances (s = 3 here
    corresponds to ``softmax_scale=9``), and it silently drops samples whose
    probability underflows to exactly 0 (the hardest ones). Hence not used.

    Proxies are initialised ``normal(0, 1)`` and then L2-normalised (the D&C
    code divides by 8, i.e. norm ≈ 1 for d = 64); since they are normalised
    in the forward pass, only the initial direction matters and unit norm
    keeps the gradient scale independent of the embedding dimension. The
    proxy learning-rate multiplier is the trainer's business.

    Args:
        num_classes: C >= 2.
        embedding_dim: d.
        scale: s > 0.
    """

    def __init__(self, num_classes: int, embedding_dim: int, *, scale: float = 3.0) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"proxy_nca needs at least 2 classes, got num_classes={num_classes}")
        check_positive("scale", scale)
        self.scale = scale
        self.proxies = nn.Parameter(F.normalize(torch.randn(num_classes, embedding_dim), dim=1))

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d), labels (B,) in 0..C-1. Returns: scalar."""
        embeddings = check_batch(embeddings, labels)
        check_labels_in_range(labels, self.proxies.shape[0])
        x = self.scale * F.normalize(embeddings, dim=1)
        p = self.scale * F.normalize(self.proxies.to(x.dtype), dim=1)
        distances = squared_distances(x, p)
        own = F.one_hot(labels, num_classes=p.shape[0]).bool()
        positive = distances.gather(1, labels.unsqueeze(1)).squeeze(1)
        others = torch.logsumexp((-distances).masked_fill(own, float("-inf")), dim=1)
        return (positive + others).mean()
