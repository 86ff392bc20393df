"""Reference rows (``recipe: reference``): a backbone's pooled features, not trained at all.

Two rows put every table on a scale: the frozen *pretrained* backbone (what fine-tuning must beat;
the papers' "ImageNet features") and the *untrained* network (random weights: what any structure
in the data gives for free). Both embed an image as its L2-normalised pooled backbone features,
(B, C) with C the backbone's ``pool`` channels (128 for ``small_cnn`` at width 16), and differ only
in ``training.backbone.pretrained``. The run has ``training.epochs: 0``: the trainer writes the
initial weights as the checkpoint, so embedding, evaluation and the tables treat the row like any
other run.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from dmlbench.methods.base import Recipe
from dmlbench.models.backbones import build_backbone
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import PooledFeatures


class ReferenceRecipe(Recipe):
    """Pooled backbone features, L2-normalised; nothing trained (``training.epochs`` must be 0)."""

    def __init__(self, run: Mapping[str, Any]):
        super().__init__(run)
        if self.settings.epochs != 0:
            raise ValueError(
                f"methods.{run.get('method', '?')}: recipe 'reference' trains nothing; set "
                f"training.epochs: 0 in that entry (got {self.settings.epochs})"
            )

    def build_model(self) -> nn.Module:
        """The backbone (``training.backbone``) with BatchNorm in eval mode and the pooled features as embedding."""
        backbone = build_backbone(self.settings.backbone.section)
        return Embedder(backbone, PooledFeatures(), freeze_bn=True)

    def build_loss(self, num_classes: int) -> nn.Module:
        """No loss: a reference row is never trained."""
        return nn.Module()
