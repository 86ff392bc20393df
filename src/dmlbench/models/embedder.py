"""The model a recipe trains: backbone + head, producing L2-normalised embeddings."""

from __future__ import annotations

import torch
from torch import nn

from dmlbench.models.backbones import StagedBackbone, freeze_batchnorm


class Embedder(nn.Module):
    """``head(backbone(x))``.

    Args:
        backbone: staged backbone; its ``pool`` output (B, C) feeds the head.
        head: maps (B, C) to (B, d) embeddings (unit-norm rows, or unit-norm per learner slice).
        learner_slices: for multi-learner heads, the [start, stop) column range of each learner.
        freeze_bn: keep every BatchNorm of the backbone in eval mode with frozen affine parameters.

    ``forward`` takes (B, 3, H, W) RGB in [0, 1] and returns (B, d) float32.
    """

    def __init__(
        self,
        backbone: StagedBackbone,
        head: nn.Module,
        learner_slices: list[tuple[int, int]] | None = None,
        freeze_bn: bool = False,
    ):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.learner_slices = learner_slices
        self.freeze_bn = freeze_bn
        if freeze_bn:
            freeze_batchnorm(self.backbone)

    def train(self, mode: bool = True) -> "Embedder":
        super().train(mode)
        if mode and self.freeze_bn:
            freeze_batchnorm(self.backbone)
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(images))
