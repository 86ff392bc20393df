"""The papers' backbones: hand-checked shapes at every cut point, slicing, layouts, frozen BatchNorm.

Everything here runs on randomly initialised networks (no weights needed);
real-weights checks live in test_backbone_weights.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import GoogLeNet, resnet50

from dmlbench.cli import main
from dmlbench.models.backbones import BACKBONES, build_backbone
from dmlbench.models.backbones.bninception import BNINCEPTION_LAYOUT, caffe_key
from dmlbench.models.backbones.efficientnet_lite import SamePadConv2d
from dmlbench.models.backbones.googlenet import GOOGLENET_LAYOUT
from dmlbench.models.backbones.resnet import IMAGENET_MEAN, IMAGENET_STD, RESNET50_LAYOUT
from dmlbench.models.backbones.weights import load_state
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import LinearEmbedding

PAPER_BACKBONES = ("googlenet", "bninception", "resnet50", "efficientnet_lite0")

#: (channels, side at 224 px, side at 96 px) per stage, worked out by hand from the
#: layer definitions (ceil-mode pools; TF "SAME" = ceil(side / stride) for Lite0).
EXPECTED: dict[str, dict[str, tuple[int, int, int]]] = {
    "googlenet": {
        "stem": (192, 28, 12),
        "inception3a": (256, 28, 12),
        "inception3b": (480, 28, 12),
        "pool3": (480, 14, 6),
        "inception4a": (512, 14, 6),
        "inception4b": (512, 14, 6),
        "inception4c": (512, 14, 6),
        "inception4d": (528, 14, 6),
        "inception4e": (832, 14, 6),
        "pool4": (832, 7, 3),
        "inception5a": (832, 7, 3),
        "inception5b": (1024, 7, 3),
    },
    "bninception": {
        "stem": (192, 28, 12),
        "inception3a": (256, 28, 12),
        "inception3b": (320, 28, 12),
        "inception3c": (576, 14, 6),
        "inception4a": (576, 14, 6),
        "inception4b": (576, 14, 6),
        "inception4c": (608, 14, 6),
        "inception4d": (608, 14, 6),
        "inception4e": (1056, 7, 3),
        "inception5a": (1024, 7, 3),
        "inception5b": (1024, 7, 3),
    },
    "resnet50": {
        "stem": (64, 56, 24),
        "layer1": (256, 56, 24),
        "layer2": (512, 28, 12),
        "layer3": (1024, 14, 6),
        "layer4": (2048, 7, 3),
    },
    "efficientnet_lite0": {
        "stem": (32, 112, 48),
        "block1": (16, 112, 48),
        "block2": (24, 56, 24),
        "block3": (40, 28, 12),
        "block4": (80, 14, 6),
        "block5": (112, 14, 6),
        "block6": (192, 7, 3),
        "block7": (320, 7, 3),
        "head": (1280, 7, 3),
    },
}


@pytest.fixture(scope="module")
def backbones() -> dict[str, nn.Module]:
    """One randomly initialised instance of each paper backbone (eval mode), shared by the tests."""
    torch.manual_seed(0)
    return {name: build_backbone({"name": name}).eval() for name in PAPER_BACKBONES}


def test_registry_lists_the_paper_backbones():
    assert set(PAPER_BACKBONES) | {"small_cnn"} <= set(BACKBONES)


@pytest.mark.parametrize("name", PAPER_BACKBONES)
@pytest.mark.parametrize("size, column", [(224, 1), (96, 2)])
def test_stage_shapes_at_every_cut_point(backbones, name, size, column):
    backbone = backbones[name]
    shapes = backbone.stage_shapes(size)
    expected = {stage: (row[0], row[column], row[column]) for stage, row in EXPECTED[name].items()}
    pooled = expected[list(expected)[-1]][0]
    assert shapes == {**expected, "pool": (pooled,)}
    assert list(shapes) == list(backbone.stage_names)
    assert backbone.out_channels == {stage: shape[0] for stage, shape in shapes.items()}


@pytest.mark.parametrize(
    "name, cut",
    [("googlenet", "pool3"), ("bninception", "inception3c"), ("resnet50", "layer2"), ("efficientnet_lite0", "block4")],
)
def test_stage_slices_compose_to_the_whole_network(backbones, name, cut):
    backbone = backbones[name]
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        head = backbone(x, until=cut)
        rest = backbone.stages(after=cut, until="pool")
        first = backbone.stages(after=None, until=cut)
        assert torch.allclose(first(backbone.normalize(x)), head)
        assert torch.allclose(rest(head), backbone(x), atol=1e-5)
    assert next(iter(rest.children())) is backbone.body[backbone.stage_names[backbone.index(cut) + 1]]


@pytest.mark.parametrize("name", PAPER_BACKBONES)
def test_frozen_batchnorm_stays_frozen_in_train_mode(name):
    backbone = build_backbone({"name": name, "pooling": "max"})
    model = Embedder(backbone, LinearEmbedding(backbone.out_channels["pool"], 8), freeze_bn=True).train()
    bns = [m for m in backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns and all(type(m) is nn.BatchNorm2d for m in bns)
    before = [m.running_mean.clone() for m in bns]
    model(torch.rand(2, 3, 64, 64))
    assert all(not m.training and not m.weight.requires_grad for m in bns)
    assert all(torch.equal(m.running_mean, b) for m, b in zip(bns, before))
    assert all(p.requires_grad for m in backbone.modules() if isinstance(m, nn.Conv2d) for p in m.parameters())


def _imagenet_normalized(x: torch.Tensor) -> torch.Tensor:
    """torchvision's input convention for its ImageNet weights."""
    return (x - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


def test_googlenet_equals_torchvision_with_transform_input():
    """ImageNet normalisation + transform_input (torchvision's pretrained setting) = our (x − 0.5) / 0.5."""
    torch.manual_seed(1)
    reference = GoogLeNet(aux_logits=False, transform_input=True, init_weights=True).eval()
    for m in reference.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    ours = build_backbone({"name": "googlenet"}).eval()
    load_state(ours.body, reference.state_dict(), GOOGLENET_LAYOUT, "torchvision GoogLeNet")
    x = torch.rand(2, 3, 96, 96)
    with torch.no_grad():
        assert torch.allclose(reference.fc(ours(x)), reference(_imagenet_normalized(x)), atol=1e-4)


def test_resnet50_equals_torchvision():
    torch.manual_seed(2)
    reference = resnet50().eval()
    ours = build_backbone({"name": "resnet50"}).eval()
    load_state(ours.body, reference.state_dict(), RESNET50_LAYOUT, "torchvision ResNet-50")
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        assert torch.allclose(reference.fc(ours(x)), reference(_imagenet_normalized(x)), atol=1e-4)


def test_resnet50_max_pooling_for_mpn():
    backbone = build_backbone({"name": "resnet50", "pooling": "max"}).eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(backbone(x), backbone(x, until="layer4").amax(dim=(2, 3)))


#: Keys and shapes of Cadene's ``pretrainedmodels`` BNInception, transcribed from its
#: source (``bninception.py``; the 52deb4733 file stores BatchNorm tensors as (1, C)).
CADENE_KEYS = {
    "conv1_7x7_s2.weight": (64, 3, 7, 7),
    "conv1_7x7_s2.bias": (64,),
    "conv1_7x7_s2_bn.weight": (64,),
    "conv2_3x3_reduce.weight": (64, 64, 1, 1),
    "conv2_3x3.weight": (192, 64, 3, 3),
    "conv2_3x3_bn.running_var": (192,),
    "inception_3a_1x1.weight": (64, 192, 1, 1),
    "inception_3a_pool_proj.weight": (32, 192, 1, 1),
    "inception_3b_double_3x3_2.weight": (96, 96, 3, 3),
    "inception_3c_3x3.weight": (160, 128, 3, 3),
    "inception_3c_double_3x3_2_bn.running_mean": (96,),
    "inception_4a_1x1.weight": (224, 576, 1, 1),
    "inception_4d_double_3x3_reduce.weight": (160, 608, 1, 1),
    "inception_4e_3x3_reduce.weight": (128, 608, 1, 1),
    "inception_4e_double_3x3_1.weight": (256, 192, 3, 3),
    "inception_5a_1x1.weight": (352, 1056, 1, 1),
    "inception_5a_double_3x3_reduce.weight": (160, 1056, 1, 1),
    "inception_5b_pool_proj.weight": (128, 1024, 1, 1),
    "inception_5b_double_3x3_2_bn.bias": (224,),
}


def test_bninception_key_layout_matches_cadene(backbones):
    body = backbones["bninception"].body
    theirs = {
        caffe_key(k): tuple(v.shape) for k, v in body.state_dict().items() if not k.endswith("num_batches_tracked")
    }
    for key, shape in CADENE_KEYS.items():
        assert theirs.get(key) == shape, key
    # 69 conv+BN units (3 stem, 7 per block with a 1×1 branch, 5 in 3c and 4e), 6 tensors each.
    assert len(theirs) == 69 * 6
    assert not any(k.startswith(BNINCEPTION_LAYOUT.ignored_prefixes) for k in theirs)


def test_bninception_loads_a_cadene_style_checkpoint(backbones):
    """(1, C) BatchNorm tensors, no num_batches_tracked, a last_linear classifier: all handled."""
    source = backbones["bninception"].body
    checkpoint = {
        caffe_key(k): (v.unsqueeze(0) if ".bn." in k else v) + 0.5
        for k, v in source.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    checkpoint |= {"last_linear.weight": torch.zeros(1000, 1024), "last_linear.bias": torch.zeros(1000)}
    target = build_backbone({"name": "bninception"})
    load_state(target.body, checkpoint, BNINCEPTION_LAYOUT, "cadene-style")
    for key, value in target.body.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(value, source.state_dict()[key] + 0.5), key


def test_bninception_input_is_bgr_255_minus_mean(backbones):
    x = torch.rand(1, 3, 4, 4)
    out = backbones["bninception"].normalize(x)
    assert torch.allclose(out[:, 0], x[:, 2] * 255 - 104)
    assert torch.allclose(out[:, 2], x[:, 0] * 255 - 128)


def test_bninception_odd_side_at_a_reduction_block_is_a_clear_error(backbones):
    with pytest.raises(ValueError, match="block 4e.*even input side"):
        backbones["bninception"](torch.rand(1, 3, 112, 112))


def test_same_padding_is_tensorflows():
    conv = SamePadConv2d(1, 1, 3, stride=2)
    x = torch.rand(1, 1, 6, 6)
    expected = F.conv2d(F.pad(x, (0, 1, 0, 1)), conv.weight, stride=2)  # even side: extra pixel bottom/right
    assert torch.allclose(conv(x), expected)
    x = torch.rand(1, 1, 7, 7)
    assert torch.allclose(conv(x), F.conv2d(F.pad(x, (1, 1, 1, 1)), conv.weight, stride=2))
    shapes = build_backbone({"name": "efficientnet_lite0"}).stage_shapes(97)
    assert [shapes[s][1] for s in ("stem", "block2", "block3", "block4", "block6")] == [49, 25, 13, 7, 4]


def test_info_backbones_prints_every_backbone(capsys):
    assert main(["info", "backbones", "--image-size", "64"]) == 0
    out = capsys.readouterr().out
    for name in PAPER_BACKBONES:
        assert f"{name} (input 3×64×64)" in out
    assert "pool3        480×4×4" in out and "inception5b  1024×2×2" in out
