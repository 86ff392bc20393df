"""Image transforms: PIL RGB image → float tensor (3, H, W) in [0, 1].

Normalisation (mean/std, channel order, value range) belongs to the backbone
(:mod:`dmlbench.models.backbones`), so the same transforms serve every backbone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchvision import transforms as T


def training_transform(image: Mapping[str, Any]) -> T.Compose:
    """Random resized crop (``image.train_crop`` px, area ``image.crop_scale``) + horizontal flip.

    Args:
        image: the ``training.image`` params section.
    """
    steps: list[Any] = [
        T.RandomResizedCrop(image["train_crop"], scale=tuple(image["crop_scale"]),
                            interpolation=T.InterpolationMode.BILINEAR, antialias=True),
    ]
    if image["flip"]:
        steps.append(T.RandomHorizontalFlip())
    steps.append(T.ToTensor())
    return T.Compose(steps)


def eval_transform(image: Mapping[str, Any]) -> T.Compose:
    """Resize the shorter side to ``image.resize`` px, centre crop ``image.test_crop`` px."""
    return T.Compose([
        T.Resize(image["resize"], interpolation=T.InterpolationMode.BILINEAR, antialias=True),
        T.CenterCrop(image["test_crop"]),
        T.ToTensor(),
    ])
