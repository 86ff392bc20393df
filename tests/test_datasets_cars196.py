"""Cars196 on a miniature fake with a cars_annos.mat in the real file's structure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
from datasets_fakes import CARS_CLASSES, make_cars, snapshot
from PIL import Image

from dmlbench.data import cars196
from dmlbench.data.images import parse_bbox
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.data.registry import prepare_dataset


@pytest.fixture
def fake(tmp_path):
    return make_cars(tmp_path / "raw")


def test_parsing_mat_file(fake, tmp_path):
    frame = read_manifest(cars196.prepare(fake.config("cars196"), tmp_path / "out"))
    assert frame.loc[0, "path"] == str(fake.root / "car_ims/000001.jpg")
    assert dict(zip(frame["label"], frame["class_name"]))[196] == "Make196 Model 2000"
    for path, bbox in zip(frame["path"], frame["bbox"]):
        assert parse_bbox(bbox) == fake.bboxes[str(Path(path).relative_to(fake.root))]


def test_split_is_classes_1_to_98_train_ignoring_test_field(fake, tmp_path):
    frame = read_manifest(cars196.prepare(fake.config("cars196"), tmp_path / "out"))
    assert set(frame.loc[frame["split"] == "train", "label"]) == {c for c in CARS_CLASSES if c <= 98}
    assert set(frame.loc[frame["split"] == "test", "label"]) == {c for c in CARS_CLASSES if c > 98}


def test_cropped_variant_crop_size_equals_bbox(fake, tmp_path):
    before = snapshot(fake.root)
    out = tmp_path / "out"
    frame = read_manifest(cars196.prepare(fake.config("cars196", cropped=True), out))
    assert snapshot(fake.root) == before
    assert "bbox" not in frame.columns
    for path in frame["path"]:
        _, _, w, h = fake.bboxes[str(Path(path).relative_to(out / "images"))]
        with Image.open(path) as img:
            assert img.size == (w, h) and img.mode == "RGB"


def test_corrupt_image_fails_cropping_naming_its_path(fake, tmp_path):
    victim = fake.root / "car_ims/000003.jpg"
    victim.write_bytes(victim.read_bytes()[:40])  # valid header, truncated data
    with pytest.raises(ValueError, match="000003.jpg"):  # through the atomic folder, as every prepare runs
        prepare_dataset(fake.config("cars196", cropped=True, verify_images=False), tmp_path / "out")
    assert not (tmp_path / "out" / "images").exists()
    assert not (tmp_path / "out" / "manifest.csv").exists()


def test_mat_without_annotations_field_is_named(fake, tmp_path):
    mat = scipy.io.loadmat(fake.root / "cars_annos.mat")
    ann = mat["annotations"]
    kept = [n for n in ann.dtype.names if n != "class"]
    reduced = np.empty(ann.shape, dtype=[(n, "O") for n in kept])
    for n in kept:
        reduced[n] = ann[n]
    scipy.io.savemat(fake.root / "cars_annos.mat", {"annotations": reduced, "class_names": mat["class_names"]})
    with pytest.raises(ManifestError, match=r"cars_annos.mat: annotations lack field\(s\) \['class'\]"):
        cars196.prepare(fake.config("cars196"), tmp_path / "out")


def test_not_a_mat_file(fake, tmp_path):
    (fake.root / "cars_annos.mat").write_bytes(b"garbage")
    with pytest.raises(ManifestError, match="cars_annos.mat: cannot read"):
        cars196.prepare(fake.config("cars196"), tmp_path / "out")
