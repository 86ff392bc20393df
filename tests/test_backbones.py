"""Backbones: named stages, shapes at every cut point, stage slicing, frozen BatchNorm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dmlbench.models.backbones import build_backbone
from dmlbench.models.embedder import Embedder
from dmlbench.models.heads import LinearEmbedding


@pytest.mark.parametrize("size, spatial", [(56, [28, 14, 7, 4, 2]), (224, [112, 56, 28, 14, 7])])
def test_small_cnn_stage_shapes(size, spatial):
    backbone = build_backbone({"name": "small_cnn", "width": 8})
    shapes = backbone.stage_shapes(size)
    assert list(shapes) == ["stem", "stage1", "stage2", "stage3", "stage4", "pool"]
    channels = [8, 8, 16, 32, 64]
    for (name, shape), c, s in zip(list(shapes.items())[:-1], channels, spatial):
        assert shape == (c, s, s), name
    assert shapes["pool"] == (64,)
    assert backbone.out_channels == {n: s[0] for n, s in shapes.items()}


def test_stage_slices_compose_to_the_whole_network():
    backbone = build_backbone({"name": "small_cnn", "width": 4}).eval()
    x = torch.rand(2, 3, 32, 32)
    features = backbone(x, until="stage2")
    rest = backbone.stages(after="stage2", until="pool")
    assert list(dict(rest.named_children())) == ["stage3", "stage4", "pool"]
    assert torch.allclose(rest(features), backbone(x), atol=1e-6)
    assert rest[0] is backbone.body["stage3"]  # shared, not copied


def test_unknown_stage_and_empty_range_errors():
    backbone = build_backbone({"name": "small_cnn"})
    with pytest.raises(KeyError, match="no stage 'pool5'.*stem"):
        backbone(torch.rand(1, 3, 32, 32), until="pool5")
    with pytest.raises(ValueError, match="empty stage range"):
        backbone.stages(after="stage3", until="stage2")
    with pytest.raises(KeyError, match="unknown; known"):
        build_backbone({"name": "vgg99"})
    with pytest.raises(ValueError, match="small_cnn"):
        build_backbone({"name": "small_cnn", "depth": 3})


def test_frozen_batchnorm_stays_frozen_in_train_mode():
    backbone = build_backbone({"name": "small_cnn", "width": 4})
    model = Embedder(backbone, LinearEmbedding(32, 8), freeze_bn=True).train()
    bn = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    before = bn[0].running_mean.clone()
    model(torch.rand(4, 3, 32, 32))
    assert all(not m.training for m in bn)
    assert all(not p.requires_grad for m in bn for p in m.parameters())
    assert torch.equal(bn[0].running_mean, before)


def test_embeddings_are_unit_norm():
    model = Embedder(build_backbone({"name": "small_cnn", "width": 4}), LinearEmbedding(32, 8))
    out = model(torch.rand(5, 3, 32, 32))
    assert out.shape == (5, 8)
    assert torch.allclose(out.norm(dim=1), torch.ones(5), atol=1e-6)


def test_frozen_through_stops_gradients_and_statistics_below_the_cut_only():
    """``frozen_through: stage2``: stem, stage1, stage2 get no gradient and keep their BatchNorm
    statistics in train mode (BN otherwise trains here), stage3 and stage4 train; the weights of the
    frozen stages equal those of an unfrozen twin built from the same seed."""
    torch.manual_seed(0)
    free = build_backbone({"name": "small_cnn", "width": 4})
    torch.manual_seed(0)
    backbone = build_backbone({"name": "small_cnn", "width": 4, "frozen_through": "stage2"})
    assert backbone.frozen_stages == ("stem", "stage1", "stage2")
    torch.testing.assert_close(backbone.state_dict(), free.state_dict())
    model = Embedder(backbone, LinearEmbedding(32, 8)).train()
    frozen_bn = [
        m for n in ("stem", "stage1", "stage2") for m in backbone.body[n].modules() if isinstance(m, nn.BatchNorm2d)
    ]
    trained_bn = [m for m in backbone.body["stage3"].modules() if isinstance(m, nn.BatchNorm2d)]
    before = [m.running_mean.clone() for m in frozen_bn + trained_bn]
    model(torch.rand(4, 3, 32, 32)).sum().backward()
    for name in ("stem", "stage1", "stage2"):
        assert all(p.grad is None and not p.requires_grad for p in backbone.body[name].parameters()), name
    for name in ("stage3", "stage4"):
        assert all(
            p.grad is not None and p.grad.abs().sum() > 0 for p in backbone.body[name].parameters() if p.dim() > 1
        ), name
    after = [m.running_mean for m in frozen_bn + trained_bn]
    assert all(torch.equal(b, a) for b, a in zip(before[: len(frozen_bn)], after[: len(frozen_bn)]))
    assert not any(torch.equal(b, a) for b, a in zip(before[len(frozen_bn) :], after[len(frozen_bn) :]))
    assert all(not m.training for m in frozen_bn) and all(m.training for m in trained_bn)


def test_frozen_through_errors_name_the_key():
    with pytest.raises(ValueError, match="frozen_through.*no stage 'block3'.*stem"):
        build_backbone({"name": "small_cnn", "frozen_through": "block3"})
    with pytest.raises(ValueError, match="frozen_through: 'pool' would freeze the whole backbone"):
        build_backbone({"name": "small_cnn", "frozen_through": "pool"})
