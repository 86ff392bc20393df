"""Binomial deviance loss (Yi et al. 2014) as written in DeML eq. 5."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_batch, check_positive
from .pairwise import label_masks, masked_mean

__all__ = ["BinomialDevianceLoss"]


class BinomialDevianceLoss(nn.Module):
    """Binomial deviance on the cosine similarity ``S`` of all ordered pairs.

    DeML eq. 5 writes, per pair (p, q), ``log(1 + exp(-(2 s - 1) α (S - β) γ))``
    with ``s = 1, γ = 1`` for a positive pair and ``s = 0, γ = C`` for a
    negative one, i.e.::

        positive: log(1 + exp(-α (S - β)))
        negative: log(1 + exp(+α (S - β) C))

    (this is Yi et al. 2014's cost matrix ``M = +1 / -C``). Each term is
    weighted by 1 / w_pq = 1 / (number of positive resp. negative pairs), so
    the loss is ``mean over positive pairs + mean over negative pairs``. Pairs
    ``(p, p)`` are excluded; counting ordered or unordered pairs gives the
    same means. ``log(1 + exp(z))`` is computed as ``softplus(z)``.

    Sources / differences:
        * DeML (Chen & Deng 2019) eq. 5: α = 2, β = 0.5, C = 35; DIABLO §3.5:
          β = 0.5, C = 25 (the default here, as this is the DIABLO baseline).
          DeML's released code is Caffe-only.
        * pytorch-metric-learning has no binomial deviance loss.

    An empty group contributes 0: a batch without positive pairs gives the
    negative mean only; a batch of one sample gives 0 (with a grad_fn).

    Args:
        alpha: scale α > 0.
        beta: translation β of the similarity.
        neg_weight: penalty C > 0 of the negative pairs.
    """

    def __init__(self, *, alpha: float = 2.0, beta: float = 0.5, neg_weight: float = 25.0) -> None:
        super().__init__()
        check_positive("alpha", alpha)
        check_positive("neg_weight", neg_weight)
        self.alpha = alpha
        self.beta = beta
        self.neg_weight = neg_weight

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Args: embeddings (B, d), labels (B,). Returns: scalar.

        The embeddings are L2-normalised again so that ``S`` is exactly the
        cosine similarity of DeML eq. 5 (a no-op for normalised inputs).
        """
        embeddings = F.normalize(check_batch(embeddings, labels), dim=1)
        scaled = self.alpha * (embeddings @ embeddings.T - self.beta)
        positive, negative = label_masks(labels)
        positive_term = masked_mean(F.softplus(-scaled), positive)
        negative_term = masked_mean(F.softplus(self.neg_weight * scaled), negative)
        return positive_term + negative_term
