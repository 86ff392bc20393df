"""Divide-and-conquer embedding head: one linear layer split into K learners (Sanakoyeu et al. 2019, §3.2).

The d-dimensional embedding layer is cut into K consecutive slices ("learners"),
each L2-normalised on its own; the test-time embedding is their concatenation.
Each learner is its own ``nn.Linear`` so that a loss computed on learner k
alone leaves the other learners' parameters without a gradient (``grad is
None``, not zero): optimisers such as Adam then skip them entirely (no moment
update, no weight decay), exactly as if the slice were not part of the model
for that step (the authors' code slices one shared layer and relies on zero
gradients instead, which still decays the other slices' weights).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def learner_slices(dim: int, num_learners: int) -> list[tuple[int, int]]:
    """[start, stop) columns of each of K consecutive slices of a d-dimensional embedding.

    The first ``d mod K`` slices get one extra column when d is not a multiple of K.

    Raises:
        ValueError: K < 1 or K > d.

    >>> learner_slices(8, 3)
    [(0, 3), (3, 6), (6, 8)]
    """
    if not 1 <= num_learners <= dim:
        raise ValueError(f"num_learners must be in 1..embedding_dim ({dim}), got {num_learners}")
    base, extra = divmod(dim, num_learners)
    bounds = [0]
    for k in range(num_learners):
        bounds.append(bounds[-1] + base + (1 if k < extra else 0))
    return list(zip(bounds[:-1], bounds[1:]))


class SplitLinearEmbedding(nn.Module):
    """K linear learners C → d_k (Σ d_k = d), each followed by its own L2 normalisation.

    With K = 1 this is exactly :class:`~dmlbench.models.heads.LinearEmbedding` (same
    parameter shapes created in the same order, so the same initial weights for a seed).

    Args:
        in_features: C, channels of the backbone's pooled features.
        dim: d, total embedding size.
        num_learners: K, 1 ≤ K ≤ d.
    """

    def __init__(self, in_features: int, dim: int, num_learners: int):
        super().__init__()
        self.slices = learner_slices(dim, num_learners)
        self.learners = nn.ModuleList(nn.Linear(in_features, stop - start) for start, stop in self.slices)

    @property
    def num_learners(self) -> int:
        """K."""
        return len(self.learners)

    def learner(self, features: torch.Tensor, k: int) -> torch.Tensor:
        """Learner k alone: (B, C) features → (B, d_k) unit-norm rows; only learner k gets gradients."""
        return F.normalize(self.learners[k](features), dim=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, C) → (B, d): the concatenation of the K unit-norm learner outputs (row norm √K)."""
        return torch.cat([self.learner(features, k) for k in range(self.num_learners)], dim=1)

    def merged(self, features: torch.Tensor) -> torch.Tensor:
        """The full embedding re-normalised to unit norm (merge-and-fine-tune phase): forward / √K.

        Equals the authors' ``normalize(concat(...))`` since every slice has unit norm; with
        K = 1 it is bit-identical to :meth:`forward` (division by 1).
        """
        return self(features) / math.sqrt(self.num_learners)
