"""GoogLeNet (Inception-v1) as named stages, in torchvision's layout (ABE, DeML, DIABLO papers).

The modules are torchvision's ``GoogLeNet`` (without the auxiliary classifiers,
the dropout and the classifier), so torchvision's checkpoint
``googlenet-1378be20.pth`` loads unchanged (its ``aux1.*``, ``aux2.*`` and
``fc.*`` keys are skipped). This is the TF-slim Inception-v1 port with
BatchNorm (and torchvision's 3×3 instead of 5×5 in the third branch), not the
BVLC Caffe model without BatchNorm that the papers fine-tuned.

Input: torchvision normalises with the ImageNet mean/std and then, for these
weights, applies ``transform_input``, which maps back to ``(x − 0.5) / 0.5``;
both steps are folded into this backbone's ``normalize`` (mean = std = 0.5),
so the network itself runs with ``transform_input=False``.

Stages and output shapes at 224 px:

=========== ============ ===========
stage        shape       torchvision
=========== ============ ===========
stem        192×28×28    conv1 … maxpool2
inception3a 256×28×28
inception3b 480×28×28
pool3       480×14×14    maxpool3 (ABE's S ends here)
inception4a 512×14×14
inception4b 512×14×14
inception4c 512×14×14
inception4d 528×14×14
inception4e 832×14×14
pool4       832×7×7      maxpool4
inception5a 832×7×7
inception5b 1024×7×7
pool        1024         global average (or max)
=========== ============ ===========
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from torch import nn
from torchvision.models import GoogLeNet, GoogLeNet_Weights

from dmlbench.models.backbones.base import GlobalPool, InputNormalization, StagedBackbone
from dmlbench.models.backbones.weights import RemoteFile, WeightLayout, load_pretrained, renamed_prefixes

#: ImageNet normalisation followed by torchvision's ``transform_input``: (x − 0.5) / 0.5.
GOOGLENET_MEAN = (0.5, 0.5, 0.5)
GOOGLENET_STD = (0.5, 0.5, 0.5)

GOOGLENET_LAYOUT = WeightLayout(
    name="torchvision GoogLeNet",
    backbone="googlenet",
    checkpoint_key=renamed_prefixes({"stem.": ""}),
    ignored_prefixes=("aux1.", "aux2.", "fc."),
    imagenet={"IMAGENET1K_V1": RemoteFile(GoogLeNet_Weights.IMAGENET1K_V1.url)},
)

#: stage → (torchvision attributes, output channels)
_STAGES: dict[str, tuple[tuple[str, ...], int]] = {
    "stem": (("conv1", "maxpool1", "conv2", "conv3", "maxpool2"), 192),
    "inception3a": (("inception3a",), 256),
    "inception3b": (("inception3b",), 480),
    "pool3": (("maxpool3",), 480),
    "inception4a": (("inception4a",), 512),
    "inception4b": (("inception4b",), 512),
    "inception4c": (("inception4c",), 512),
    "inception4d": (("inception4d",), 528),
    "inception4e": (("inception4e",), 832),
    "pool4": (("maxpool4",), 832),
    "inception5a": (("inception5a",), 832),
    "inception5b": (("inception5b",), 1024),
}


def build_googlenet(pretrained: Any = None, weights_sha256: str | None = None, pooling: str = "avg") -> StagedBackbone:
    """GoogLeNet with stages ``stem, inception3a, 3b, pool3, inception4a…4e, pool4, inception5a, 5b, pool``.

    Args:
        pretrained: null (random init), "imagenet" (torchvision's file from the
            torch hub cache), or a local path (see :mod:`.weights`).
        weights_sha256: expected sha256 of a local weights file.
        pooling: 'avg' or 'max' global pooling.

    Input (B, 3, H, W) RGB in [0, 1]; ``pool`` output (B, 1024).
    """
    net = GoogLeNet(aux_logits=False, transform_input=False, init_weights=True)
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    for stage, (attributes, _) in _STAGES.items():
        modules = [getattr(net, a) for a in attributes]
        stages[stage] = nn.Sequential(OrderedDict(zip(attributes, modules))) if stage == "stem" else modules[0]
    stages["pool"] = GlobalPool(pooling)
    out_channels = {stage: channels for stage, (_, channels) in _STAGES.items()} | {"pool": 1024}
    backbone = StagedBackbone(InputNormalization(GOOGLENET_MEAN, GOOGLENET_STD), stages, out_channels)
    load_pretrained(backbone.body, pretrained, GOOGLENET_LAYOUT, weights_sha256)
    return backbone
