"""In-Shop Clothes Retrieval on a miniature fake: train / query / gallery."""

from __future__ import annotations

import pytest
from datasets_fakes import make_inshop, snapshot

from dmlbench.data import inshop
from dmlbench.data.manifest import ManifestError, read_manifest


@pytest.mark.parametrize("drive_layout", [False, True])
def test_query_gallery_and_train_splits(tmp_path, drive_layout):
    fake = make_inshop(tmp_path / "raw", drive_layout=drive_layout)
    before = snapshot(fake.root)
    frame = read_manifest(inshop.prepare(fake.config("inshop"), tmp_path / "out"))
    assert snapshot(fake.root) == before
    by_split = {s: set(g["label"]) for s, g in frame.groupby("split")}
    assert by_split == {"train": {1, 2, 3, 4}, "query": {5, 6, 7, 8}, "gallery": {5, 6, 7, 8}}
    base = fake.root / ("Img" if drive_layout else "")
    first = frame.iloc[0]
    assert first["path"] == str(base / "img/WOMEN/Dresses/id_00000001/01_1_front.jpg")
    assert first["class_name"] == "id_00000001"


def test_declared_count_must_match_rows(tmp_path):
    fake = make_inshop(tmp_path / "raw")
    listing = fake.root / "list_eval_partition.txt"
    lines = listing.read_text().splitlines(keepends=True)
    listing.write_text("".join(lines[:-1]))
    with pytest.raises(ManifestError, match=r"list_eval_partition.txt: first line says '20' images, the file lists 19"):
        inshop.prepare(fake.config("inshop"), tmp_path / "out")


def test_unknown_evaluation_status(tmp_path):
    fake = make_inshop(tmp_path / "raw")
    listing = fake.root / "list_eval_partition.txt"
    listing.write_text(listing.read_text().replace("gallery", "galery", 1))
    with pytest.raises(ManifestError, match="'galery'"):
        inshop.prepare(fake.config("inshop"), tmp_path / "out")


def test_missing_image_folder_is_named(tmp_path):
    fake = make_inshop(tmp_path / "raw")
    (fake.root / "img").rename(fake.root / "images")
    with pytest.raises(FileNotFoundError, match=r"img or .*Img/img not found"):
        inshop.prepare(fake.config("inshop"), tmp_path / "out")
