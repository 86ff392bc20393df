"""BN-Inception (Ioffe & Szegedy, 2015) as named stages (MPN, Divide-and-Conquer and most DML code).

The architecture and parameter names follow the Caffe model converted to
PyTorch in Cadene's ``pretrainedmodels`` (``bninception``), whose ImageNet file
``bn_inception-52deb4733.pth`` nearly every DML code base loads. Its keys are
flat, e.g. ``conv1_7x7_s2.weight``, ``conv1_7x7_s2_bn.running_mean``,
``inception_3a_1x1.weight``, ``inception_3a_double_3x3_1_bn.bias``,
``inception_3c_3x3.weight``, ``last_linear.weight``; here they are grouped into
stages (``inception3a.branches.2.double_3x3_1.bn.bias`` ↔
``inception_3a_double_3x3_1_bn.bias``), see :func:`caffe_key`. Every
convolution has a bias and is followed by BatchNorm (eps 1e-5) and ReLU.
That file stores the BatchNorm tensors as (1, C); they are squeezed on load,
as DML codes do.

Input convention of the converted Caffe weights: BGR, range 0–255, minus the
mean (104, 117, 128) (B, G, R), std 1 — done by this backbone's ``normalize``
on the usual RGB [0, 1] input.

Stages and output shapes at 224 px: ``stem`` 192×28×28, ``inception3a``
256×28×28, ``inception3b`` 320×28×28, ``inception3c`` 576×14×14,
``inception4a`` 576, ``inception4b`` 576, ``inception4c`` 608, ``inception4d``
608 (×14×14), ``inception4e`` 1056×7×7, ``inception5a`` 1024×7×7,
``inception5b`` 1024×7×7, ``pool`` 1024.

Like the Caffe original, the two stride-2 blocks (3c, 4e) concatenate a
floor-rounded strided convolution with a ceil-rounded max pool, so their input
side must be even (224 and 227 are fine; e.g. 112 is not); an odd side raises
an error naming the block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dmlbench.models.backbones.base import GlobalPool, StagedBackbone
from dmlbench.models.backbones.weights import RemoteFile, WeightLayout, load_pretrained

#: Caffe BGR mean on the 0–255 scale (Cadene's ``pretrained_settings['bninception']``).
BNINCEPTION_MEAN_BGR = (104.0, 117.0, 128.0)


class CaffeBGRNormalization(nn.Module):
    """RGB in [0, 1] → BGR in 0–255 minus a per-channel mean: (B, 3, H, W) → (B, 3, H, W)."""

    mean: torch.Tensor  # (1, 3, 1, 1) buffer

    def __init__(self, mean_bgr: tuple[float, float, float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean_bgr, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(1) * 255.0 - self.mean


def conv_bn_relu(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """Conv (with bias, 'same'-style padding k // 2) → BatchNorm → ReLU; children ``conv, bn, relu``."""
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2),
            bn=nn.BatchNorm2d(c_out, eps=1e-5),
            relu=nn.ReLU(inplace=True),
        )
    )


@dataclass(frozen=True)
class InceptionSpec:
    """Widths of one BN-Inception block (0 = branch absent); ``stride`` 2 for the reduction blocks."""

    c_in: int
    c1x1: int
    c3x3_reduce: int
    c3x3: int
    double_reduce: int
    double: int
    pool: str  # 'avg' or 'max'
    pool_proj: int
    stride: int = 1

    @property
    def c_out(self) -> int:
        return self.c1x1 + self.c3x3 + self.double + (self.pool_proj or self.c_in)


#: Block name → widths, from the converted Caffe model (``inception_<name>_*`` keys).
INCEPTION_SPECS: dict[str, InceptionSpec] = {
    "3a": InceptionSpec(192, 64, 64, 64, 64, 96, "avg", 32),
    "3b": InceptionSpec(256, 64, 64, 96, 64, 96, "avg", 64),
    "3c": InceptionSpec(320, 0, 128, 160, 64, 96, "max", 0, stride=2),
    "4a": InceptionSpec(576, 224, 64, 96, 96, 128, "avg", 128),
    "4b": InceptionSpec(576, 192, 96, 128, 96, 128, "avg", 128),
    "4c": InceptionSpec(576, 160, 128, 160, 128, 160, "avg", 128),
    "4d": InceptionSpec(608, 96, 128, 192, 160, 192, "avg", 128),
    "4e": InceptionSpec(608, 0, 128, 192, 192, 256, "max", 0, stride=2),
    "5a": InceptionSpec(1056, 352, 192, 320, 160, 224, "avg", 128),
    "5b": InceptionSpec(1024, 352, 192, 320, 192, 224, "max", 128),
}


class InceptionBN(nn.Module):
    """One BN-Inception block: (B, c_in, H, W) → (B, c_out, H/stride, W/stride).

    Branches, concatenated in this order (the Caffe model's): 1×1; 1×1 → 3×3;
    1×1 → 3×3 → 3×3; 3×3 pool (→ 1×1 projection). Each conv unit is named as
    in the Caffe model (``1x1``, ``3x3_reduce``, ``3x3``, ``double_3x3_reduce``,
    ``double_3x3_1``, ``double_3x3_2``, ``pool_proj``).
    """

    def __init__(self, name: str, spec: InceptionSpec):
        super().__init__()
        self.name = name
        s = spec.stride
        branches: list[nn.Sequential] = []
        if spec.c1x1:
            branches.append(nn.Sequential(OrderedDict({"1x1": conv_bn_relu(spec.c_in, spec.c1x1, 1)})))
        branches.append(
            nn.Sequential(
                OrderedDict(
                    {
                        "3x3_reduce": conv_bn_relu(spec.c_in, spec.c3x3_reduce, 1),
                        "3x3": conv_bn_relu(spec.c3x3_reduce, spec.c3x3, 3, s),
                    }
                )
            )
        )
        branches.append(
            nn.Sequential(
                OrderedDict(
                    {
                        "double_3x3_reduce": conv_bn_relu(spec.c_in, spec.double_reduce, 1),
                        "double_3x3_1": conv_bn_relu(spec.double_reduce, spec.double, 3),
                        "double_3x3_2": conv_bn_relu(spec.double, spec.double, 3, s),
                    }
                )
            )
        )
        pad = 1 if s == 1 else 0
        pool: dict[str, nn.Module] = {
            "pool": (
                nn.AvgPool2d(3, stride=s, padding=pad, ceil_mode=True, count_include_pad=True)
                if spec.pool == "avg"
                else nn.MaxPool2d(3, stride=s, padding=pad, ceil_mode=True)
            )
        }
        if spec.pool_proj:
            pool["pool_proj"] = conv_bn_relu(spec.c_in, spec.pool_proj, 1)
        branches.append(nn.Sequential(OrderedDict(pool)))
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        sizes = {tuple(o.shape[2:]) for o in outs}
        if len(sizes) > 1:
            raise ValueError(
                f"BN-Inception block {self.name}: branch outputs {sorted(sizes)} differ for an input of "
                f"{tuple(x.shape[2:])}; this stride-2 block needs an even input side (try a 224 or 227 px image)"
            )
        return torch.cat(outs, dim=1)


def caffe_key(key: str) -> str:
    """Our ``body`` key → the converted Caffe model's key.

    >>> caffe_key("stem.conv1_7x7_s2.bn.running_mean")
    'conv1_7x7_s2_bn.running_mean'
    >>> caffe_key("inception3c.branches.1.double_3x3_2.conv.weight")
    'inception_3c_double_3x3_2.weight'
    """
    parts = key.split(".")
    stage, unit, kind, param = parts[0], parts[-3], parts[-2], parts[-1]
    prefix = "" if stage == "stem" else f"inception_{stage.removeprefix('inception')}_"
    return f"{prefix}{unit}{'_bn' if kind == 'bn' else ''}.{param}"


def _squeeze_bn(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """``bn_inception-52deb4733.pth`` stores BatchNorm tensors as (1, C)."""
    return tensor.squeeze(0) if "_bn." in key and tensor.dim() == 2 and tensor.shape[0] == 1 else tensor


BNINCEPTION_LAYOUT = WeightLayout(
    name="Cadene pretrainedmodels BN-Inception",
    backbone="bninception",
    checkpoint_key=caffe_key,
    ignored_prefixes=("last_linear.",),
    imagenet={"caffe": RemoteFile("http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth")},
    convert=_squeeze_bn,
)


def build_bninception(
    pretrained: Any = None, weights_sha256: str | None = None, pooling: str = "avg"
) -> StagedBackbone:
    """BN-Inception with stages ``stem, inception3a, 3b, 3c, 4a…4e, 5a, 5b, pool``.

    Args:
        pretrained: null (random init), "imagenet" (``bn_inception-52deb4733.pth``
            from the torch hub cache), or a local path (see :mod:`.weights`).
        weights_sha256: expected sha256 of a local weights file.
        pooling: 'avg' or 'max' global pooling.

    Input (B, 3, H, W) RGB in [0, 1]; ``pool`` output (B, 1024).
    """
    stem = nn.Sequential(
        OrderedDict(
            conv1_7x7_s2=conv_bn_relu(3, 64, 7, 2),
            pool1_3x3_s2=nn.MaxPool2d(3, stride=2, ceil_mode=True),
            conv2_3x3_reduce=conv_bn_relu(64, 64, 1),
            conv2_3x3=conv_bn_relu(64, 192, 3),
            pool2_3x3_s2=nn.MaxPool2d(3, stride=2, ceil_mode=True),
        )
    )
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=stem)
    out_channels = {"stem": 192}
    for name, spec in INCEPTION_SPECS.items():
        stages[f"inception{name}"] = InceptionBN(name, spec)
        out_channels[f"inception{name}"] = spec.c_out
    stages["pool"] = GlobalPool(pooling)
    out_channels["pool"] = out_channels["inception5b"]
    backbone = StagedBackbone(CaffeBGRNormalization(BNINCEPTION_MEAN_BGR), stages, out_channels)
    load_pretrained(backbone.body, pretrained, BNINCEPTION_LAYOUT, weights_sha256)
    return backbone
