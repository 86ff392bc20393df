"""A small CNN for CPU runs: stem, four residual-free conv stages, pool.

Each stage is conv3×3-BN-ReLU ×2 with the first conv strided by 2, so at a
56 px input the spatial sizes are 28 (stem), 14, 7, 4, 2 and the channels
``width × (1, 1, 2, 4, 8)``. Trained from scratch, or started from the weights
of the project's own pretraining stage (``pretrained: synthetic``, a
classification run on the synthetic dataset's pretraining classes) or a local
file saved from a ``small_cnn``'s ``body`` state dict.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn

from dmlbench.models.backbones.base import GlobalPool, InputNormalization, StagedBackbone
from dmlbench.models.backbones.weights import WeightLayout, load_pretrained

#: Per-channel statistics of the embedded synthetic dataset are close to these; any
#: fixed values work for a network trained from scratch with BatchNorm.
SMALL_CNN_MEAN = (0.5, 0.5, 0.5)
SMALL_CNN_STD = (0.25, 0.25, 0.25)


#: A ``small_cnn`` checkpoint is its ``body`` state dict as it is (``stem.0.weight``, ``stage1.0.weight``, ...).
SMALL_CNN_LAYOUT = WeightLayout(name="dmlbench small_cnn", backbone="small_cnn", checkpoint_key=lambda key: key)


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


def _stage(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(*_conv_bn_relu(c_in, c_out, 2), *_conv_bn_relu(c_out, c_out, 1))


def build_small_cnn(
    width: int = 16, pooling: str = "avg", pretrained: Any = None, weights_sha256: str | None = None
) -> StagedBackbone:
    """Stages ``stem, stage1, stage2, stage3, stage4, pool``.

    Args:
        width: channels of the stem; the stages have 1×, 2×, 4×, 8× that.
        pooling: 'avg' or 'max' global pooling.
        pretrained: null (random init), "synthetic" (the pretraining stage's weights) or a local
            path (see :mod:`.weights`); the file must have been saved with the same width.
        weights_sha256: expected sha256 of a local weights file.
    """
    channels = [width, width, 2 * width, 4 * width, 8 * width]
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=nn.Sequential(*_conv_bn_relu(3, width, 2)))
    for i in range(1, 5):
        stages[f"stage{i}"] = _stage(channels[i - 1], channels[i])
    stages["pool"] = GlobalPool(pooling)
    out_channels = {"stem": width, **{f"stage{i}": channels[i] for i in range(1, 5)}, "pool": channels[-1]}
    backbone = StagedBackbone(InputNormalization(SMALL_CNN_MEAN, SMALL_CNN_STD), stages, out_channels)
    load_pretrained(backbone.body, pretrained, SMALL_CNN_LAYOUT, weights_sha256)
    return backbone
