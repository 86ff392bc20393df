"""Image transforms: PIL RGB image → float tensor (3, H, W) in [0, 1].

Normalisation (mean/std, channel order, value range) belongs to the backbone
(:mod:`dmlbench.models.backbones`), so the same transforms serve every backbone.
"""

from __future__ import annotations

from typing import Any

from torchvision import transforms as T

from dmlbench.settings import ImageSettings


def training_transform(image: ImageSettings) -> T.Compose:
    """Random resized crop (``image.train_crop`` px, area ``image.crop_scale``) + horizontal flip.

    Args:
        image: the run's ``training.image`` settings.
    """
    steps: list[Any] = [
        T.RandomResizedCrop(
            image.train_crop, scale=tuple(image.crop_scale), interpolation=T.InterpolationMode.BILINEAR, antialias=True
        ),
    ]
    if image.flip:
        steps.append(T.RandomHorizontalFlip())
    steps.append(T.ToTensor())
    return T.Compose(steps)


def eval_transform(resize: int, test_crop: int) -> T.Compose:
    """Resize the shorter side to ``resize`` px, centre crop ``test_crop`` px (``training.image.resize``,
    ``training.image.test_crop``)."""
    return T.Compose(
        [
            T.Resize(resize, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
            T.CenterCrop(test_crop),
            T.ToTensor(),
        ]
    )
