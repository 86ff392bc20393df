"""Embedding heads: pooled backbone features (B, C) → embeddings (B, d)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PooledFeatures(nn.Module):
    """The pooled features themselves, L2-normalised: (B, C) → (B, C) unit-norm rows (no parameters)."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(features, dim=1)


class LinearEmbedding(nn.Module):
    """A linear layer C → d followed by L2 normalisation (unit-norm rows).

    Args:
        in_features: C, channels of the backbone's pooled features.
        dim: d, embedding size.
    """

    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.linear = nn.Linear(in_features, dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.linear(features), dim=1)
