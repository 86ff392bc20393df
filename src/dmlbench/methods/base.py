"""A method is a recipe: backbone + head + loss + sampler + training hooks.

Recipes are named in ``methods.<name>.recipe``; everything they need comes from
the resolved run (:func:`dmlbench.config.resolve_run`). The trainer only talks
to this interface, so a new method is a new recipe, not a new trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from dmlbench.data.samplers import ClassBalancedBatchSampler
from dmlbench.losses import build_loss
from dmlbench.models.backbones import build_backbone
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import LinearEmbedding


class Recipe:
    """Base recipe: a linear L2-normalised embedding trained with one metric-learning loss.

    Args:
        run: the resolved run (``dataset_config``, ``method_config``, ``training``, ``seed``).
    """

    def __init__(self, run: Mapping[str, Any]):
        self.run = run
        self.training = run["training"]
        self.method = run["method_config"]

    def build_model(self) -> Embedder:
        """Backbone (``training.backbone``) + linear embedding of ``training.embedding_dim``."""
        backbone = build_backbone(self.training["backbone"])
        head = LinearEmbedding(backbone.out_channels["pool"], self.training["embedding_dim"])
        return Embedder(backbone, head, freeze_bn=self.training["backbone"].get("freeze_bn", False))

    def build_loss(self, num_classes: int) -> nn.Module:
        """The loss of ``methods.<name>.loss`` for ``num_classes`` training classes."""
        return build_loss(self.method["loss"], num_classes=num_classes, embedding_dim=self.training["embedding_dim"])

    def build_sampler(self, labels: np.ndarray, generator: torch.Generator) -> ClassBalancedBatchSampler:
        """P × K class-balanced batches from ``training.sampler``."""
        sampler = self.training["sampler"]
        return ClassBalancedBatchSampler(
            labels, sampler["classes_per_batch"], sampler["images_per_class"], generator,
            num_batches=sampler.get("batches_per_epoch"),
        )

    def training_loss(self, model: Embedder, loss: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of one batch: images (B, 3, H, W), labels (B,) in 0..C-1 → scalar."""
        return loss(model(images), labels)

    def on_epoch_start(self, epoch: int, model: Embedder) -> None:
        """Hook before each epoch (1-based); e.g. re-clustering in divide-and-conquer."""
