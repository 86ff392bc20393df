"""ResNet-50 as named stages, in torchvision's layout (MPN and Divide-and-Conquer papers).

The modules are torchvision's ``resnet50`` without its classifier, so
torchvision's checkpoints load unchanged (``fc.*`` is skipped).
``pretrained: imagenet`` means ``IMAGENET1K_V1`` (``resnet50-0676ba61.pth``, the
original 76.1 % top-1 weights that the papers' code used);
``imagenet:IMAGENET1K_V2`` selects torchvision's newer 80.9 % recipe, which is
torchvision's ``DEFAULT`` but not what the papers fine-tuned.

Input normalisation: the ImageNet mean/std on RGB in [0, 1].

Stages and output shapes at 224 px: ``stem`` 64×56×56 (conv1, bn1, relu,
maxpool), ``layer1`` 256×56×56, ``layer2`` 512×28×28, ``layer3`` 1024×14×14,
``layer4`` 2048×7×7, ``pool`` 2048 (average, or max as in MPN).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn
from torchvision.models import ResNet50_Weights, resnet50

from dmlbench.models.backbones.base import GlobalPool, InputNormalization, StagedBackbone
from dmlbench.models.backbones.weights import RemoteFile, WeightLayout, load_pretrained, renamed_prefixes

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

RESNET50_LAYOUT = WeightLayout(
    name="torchvision ResNet-50",
    backbone="resnet50",
    checkpoint_key=renamed_prefixes({"stem.": ""}),
    ignored_prefixes=("fc.",),
    imagenet={
        "IMAGENET1K_V1": RemoteFile(ResNet50_Weights.IMAGENET1K_V1.url),
        "IMAGENET1K_V2": RemoteFile(ResNet50_Weights.IMAGENET1K_V2.url),
    },
)

_OUT_CHANNELS = {"stem": 64, "layer1": 256, "layer2": 512, "layer3": 1024, "layer4": 2048, "pool": 2048}


def build_resnet50(pretrained: Any = None, weights_sha256: str | None = None, pooling: str = "avg") -> StagedBackbone:
    """ResNet-50 with stages ``stem, layer1, layer2, layer3, layer4, pool``.

    Args:
        pretrained: null (random init), "imagenet" / "imagenet:IMAGENET1K_V2"
            (torchvision's files from the torch hub cache), or a local path (see :mod:`.weights`).
        weights_sha256: expected sha256 of a local weights file.
        pooling: 'avg' or 'max' (MPN) global pooling.

    Input (B, 3, H, W) RGB in [0, 1]; ``pool`` output (B, 2048).
    """
    net = resnet50()
    stem = nn.Sequential(OrderedDict((name, getattr(net, name)) for name in ("conv1", "bn1", "relu", "maxpool")))
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=stem)
    for name in ("layer1", "layer2", "layer3", "layer4"):
        stages[name] = getattr(net, name)
    stages["pool"] = GlobalPool(pooling)
    backbone = StagedBackbone(InputNormalization(IMAGENET_MEAN, IMAGENET_STD), stages, _OUT_CHANNELS)
    load_pretrained(backbone.body, pretrained, RESNET50_LAYOUT, weights_sha256)
    return backbone
