"""Manifest, validation split, samplers and transforms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from dmlbench.data.dataset import ImageDataset
from dmlbench.data.manifest import ManifestError, assert_split_counts, read_manifest, write_manifest
from dmlbench.data.samplers import ClassBalancedBatchSampler, PairBatchSampler
from dmlbench.data.splits import carve_validation
from dmlbench.data.transforms import eval_transform, training_transform
from dmlbench.settings import ImageSettings


def frame(n_classes: int = 10, per_class: int = 3) -> pd.DataFrame:
    labels = np.repeat(np.arange(n_classes), per_class)
    return pd.DataFrame(
        {
            "path": [f"{i}.png" for i in range(len(labels))],
            "label": labels,
            "class_name": [f"c{label}" for label in labels],
            "split": "train",
        }
    )


def test_manifest_round_trip_resolves_relative_paths(tmp_path: Path):
    path = write_manifest(frame(), tmp_path / "m" / "manifest.csv")
    back = read_manifest(path)
    assert back["path"][0] == str((tmp_path / "m" / "0.png").resolve())
    assert back["label"].tolist() == frame()["label"].tolist()
    assert not list((tmp_path / "m").glob(".*tmp*"))  # no temporary file left behind


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda f: f.drop(columns="split"), "missing column"),
        (lambda f: f.assign(split="training"), "unknown split"),
        (lambda f: f.assign(label="x"), "must hold integer class ids"),
        (lambda f: f.assign(label=f["label"] + 0.5), "must hold integer class ids; line.s. 2, 3"),
        (lambda f: f.assign(split=["train", "test", "test"] * 10), "label.s. appear in both"),
        (lambda f: f.iloc[:0], "no rows"),
        (lambda f: f.assign(class_name=[f"n{i}" for i in range(len(f))]), "more than one class_name"),
    ],
)
def test_manifest_errors_name_the_problem(tmp_path: Path, mutate, message):
    with pytest.raises(ManifestError, match=message):
        write_manifest(mutate(frame()), tmp_path / "manifest.csv")
    assert not (tmp_path / "manifest.csv").exists()


def test_assert_split_counts_names_expected_and_found():
    with pytest.raises(ManifestError, match=r"split 'train' has 30 images / 10 classes, expected 31 / 10"):
        assert_split_counts(frame(), {"train": (31, 10)}, "fake")
    assert_split_counts(frame(), {"train": (30, 10)}, "fake")


def test_validation_split_is_class_disjoint_and_seeded():
    carved = carve_validation(frame(), 0.2, seed=1)
    val = set(carved.loc[carved.split == "val", "label"])
    train = set(carved.loc[carved.split == "train", "label"])
    assert len(val) == 2 and len(train) == 8 and not val & train
    assert carved.equals(carve_validation(frame(), 0.2, seed=1))
    others = {frozenset(carve_validation(frame(), 0.2, seed=s).query("split == 'val'").label) for s in range(6)}
    assert len(others) > 1  # the seed matters


def test_validation_split_errors():
    with pytest.raises(ManifestError, match="val_fraction"):
        carve_validation(frame(), 1.0, seed=0)
    with pytest.raises(ManifestError, match="need at least 2"):
        carve_validation(frame(n_classes=4), 0.2, seed=0)
    assert (carve_validation(frame(), 0.0, seed=0).split == "train").all()


def test_sampler_batches_are_p_by_k_and_seeded():
    labels = np.repeat(np.arange(6), [5, 5, 5, 5, 5, 2])
    sampler = ClassBalancedBatchSampler(labels, 3, 4, torch.Generator().manual_seed(0), num_batches=20)
    batches = list(sampler)
    assert len(batches) == 20
    for batch in batches:
        counts = np.unique(labels[batch], return_counts=True)[1]
        assert len(counts) == 3 and (counts == 4).all()
        for c in np.unique(labels[batch]):
            rows = [r for r in batch if labels[r] == c]
            if c != 5:  # classes with ≥ K images never repeat an image within the batch
                assert len(set(rows)) == 4
    again = list(ClassBalancedBatchSampler(labels, 3, 4, torch.Generator().manual_seed(0), num_batches=20))
    assert again == batches
    other = list(ClassBalancedBatchSampler(labels, 3, 4, torch.Generator().manual_seed(1), num_batches=20))
    assert other != batches


def test_sampler_default_epoch_length_and_errors():
    labels = np.repeat(np.arange(4), 6)
    assert len(ClassBalancedBatchSampler(labels, 2, 3, torch.Generator())) == 4
    with pytest.raises(ValueError, match="only 4 classes"):
        ClassBalancedBatchSampler(labels, 5, 2, torch.Generator())
    with pytest.raises(ValueError, match="images_per_class ≥ 2"):
        ClassBalancedBatchSampler(labels, 2, 1, torch.Generator())


def test_pair_sampler_gives_positive_then_negative_partners_and_is_seeded():
    labels = np.repeat(np.arange(5), [2, 3, 4, 2, 5])
    sampler = PairBatchSampler(labels, 6, torch.Generator().manual_seed(0), num_batches=20)
    batches = list(sampler)
    assert len(batches) == 20
    for batch in batches:
        anchors, partners = np.array(batch[:6]), np.array(batch[6:])
        assert (labels[anchors[:3]] == labels[partners[:3]]).all() and (anchors[:3] != partners[:3]).all()
        assert (labels[anchors[3:]] != labels[partners[3:]]).all()
    seen = np.concatenate([b[6:9] for b in batches])
    assert set(labels[seen]) == set(range(5))  # positives come from every class
    again = list(PairBatchSampler(labels, 6, torch.Generator().manual_seed(0), num_batches=20))
    assert again == batches  # a pure function of the generator
    assert len(PairBatchSampler(labels, 2, torch.Generator())) == len(labels) // 4
    with pytest.raises(ValueError, match="≥ 2 images"):
        PairBatchSampler(np.array([0, 0, 1]), 2, torch.Generator())


def test_transforms_and_dataset_read_greyscale_as_rgb(tmp_path: Path):
    path = tmp_path / "grey.png"
    Image.fromarray(np.full((40, 30), 128, dtype=np.uint8), mode="L").save(path)
    image = ImageSettings(resize=32, test_crop=28, train_crop=24, crop_scale=(0.5, 1.0), flip=True)
    dataset = ImageDataset([str(path)], np.array([3]), eval_transform(image.resize, image.test_crop))
    tensor, label, index = dataset[0]
    assert tensor.shape == (3, 28, 28) and label.item() == 3 and index == 0
    assert torch.allclose(tensor, torch.full_like(tensor, 128 / 255), atol=1e-6)
    torch.manual_seed(0)
    assert training_transform(image)(Image.open(path).convert("RGB")).shape == (3, 24, 24)


def test_unreadable_image_names_its_path(tmp_path: Path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"not an image")
    dataset = ImageDataset([str(path)], np.array([0]), eval_transform(8, 8))
    with pytest.raises(OSError, match="broken.png"):
        dataset[0]
