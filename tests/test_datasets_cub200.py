"""CUB-200-2011 on a miniature fake: parsing, the class-disjoint split, crops."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets_fakes import CUB_CLASSES, make_cub, snapshot
from PIL import Image

from dmlbench.data import cub200
from dmlbench.data.images import parse_bbox
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.data.registry import OWNER_MARKER, prepare_dataset


@pytest.fixture
def fake(tmp_path):
    return make_cub(tmp_path / "raw")


def test_parsing_labels_names_paths_and_boxes(fake, tmp_path):
    frame = read_manifest(cub200.prepare(fake.config("cub200"), tmp_path / "out"))
    first = frame.iloc[0]
    assert first["label"] == 1 and first["class_name"] == "001.Bird_1"
    assert first["path"] == str(fake.root / "images" / "001.Bird_1/Bird_1_0000_1.jpg")
    for path, bbox in zip(frame["path"], frame["bbox"]):
        assert parse_bbox(bbox) == fake.bboxes[str(Path(path).relative_to(fake.root))]


def test_split_is_by_class_id_not_train_test_split_txt(fake, tmp_path):
    frame = read_manifest(cub200.prepare(fake.config("cub200"), tmp_path / "out"))
    assert set(frame.loc[frame["split"] == "train", "label"]) == {c for c in CUB_CLASSES if c <= 100}
    assert set(frame.loc[frame["split"] == "test", "label"]) == {c for c in CUB_CLASSES if c > 100}


def test_cropped_variant_materialises_crops_of_bbox_size(fake, tmp_path):
    before = snapshot(fake.root)
    out = tmp_path / "out"
    manifest = cub200.prepare(fake.config("cub200", cropped=True), out)
    assert snapshot(fake.root) == before
    raw = manifest.read_text().splitlines()
    assert raw[0] == "path,label,class_name,split" and raw[1].startswith("images/001.Bird_1/")
    frame = read_manifest(manifest)
    for path in frame["path"]:
        _, _, w, h = fake.bboxes[str(Path(path).relative_to(out))]
        with Image.open(path) as img:
            assert img.size == (w, h) and img.mode == "RGB"
    assert sorted(p.name for p in out.iterdir()) == ["images", "manifest.csv"]


def test_cropped_rerun_replaces_previous_crops(fake, tmp_path):
    out = tmp_path / "out"
    prepare_dataset(fake.config("cub200", cropped=True), out)
    (out / "images" / "stale.jpg").write_bytes(b"x")
    prepare_dataset(fake.config("cub200", cropped=True), out)
    assert not (out / "images" / "stale.jpg").exists()
    assert sorted(p.name for p in out.iterdir()) == [OWNER_MARKER, "images", "manifest.csv"]


def test_image_without_label_names_the_file(fake, tmp_path):
    labels = fake.root / "image_class_labels.txt"
    labels.write_text("".join(labels.read_text().splitlines(keepends=True)[1:]))
    with pytest.raises(ManifestError, match=r"image_class_labels.txt: no entry for image id 1 "):
        cub200.prepare(fake.config("cub200"), tmp_path / "out")


def test_malformed_row_names_file_and_line(fake, tmp_path):
    boxes = fake.root / "bounding_boxes.txt"
    boxes.write_text(boxes.read_text() + "99 1 2 3\n")
    with pytest.raises(ManifestError, match=r"bounding_boxes.txt:19: expected 5 columns, found 4"):
        cub200.prepare(fake.config("cub200"), tmp_path / "out")


def test_cropped_must_be_boolean(fake, tmp_path):
    with pytest.raises(ValueError, match="cropped"):
        cub200.prepare(fake.config("cub200", cropped="yes"), tmp_path / "out")
