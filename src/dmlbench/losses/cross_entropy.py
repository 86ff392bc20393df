"""Label-smoothed cross-entropy shared by the classification-style losses."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from .checks import check_fraction

__all__ = ["smoothed_cross_entropy"]


def smoothed_cross_entropy(logits: Tensor, labels: Tensor, smoothing: float) -> Tensor:
    """Cross-entropy with label smoothing, averaged over the batch.

    Per sample, with ``p = softmax(logits)`` over the C classes and ε = smoothing::

        (1 - ε) * (-log p_y) + ε * mean_c(-log p_c)

    i.e. the cross-entropy to the target ``(1 - ε) * onehot(y) + ε / C``
    (Szegedy et al. 2016; the mass ε is spread over *all* C classes, the true
    one included). Some DML codes spread ε / (C - 1) over the other classes
    only (e.g. the Proxy-NCA code of the D&C authors) - a slightly different
    target. ε = 0 is plain cross-entropy.

    Args:
        logits: (B, C) unnormalised scores.
        labels: (B,) integer labels in 0..C-1.
        smoothing: ε in [0, 1).

    Returns:
        Scalar loss.
    """
    check_fraction("label_smoothing", smoothing)
    return F.cross_entropy(logits, labels, label_smoothing=smoothing)
