"""Behaviour every real-dataset preparer shares, run on miniature fakes of all five."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image
from datasets_fakes import FakeCopy, make_cars, make_cub, make_inshop, make_sop, make_vehicleid, snapshot

from dmlbench.data.images import ImageCheckError, load_rgb
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.data.official import DatasetConfigError, DatasetNotFoundError
from dmlbench.data.registry import OWNER_MARKER, prepare_dataset

#: kind -> (fake builder, a list file whose absence must be reported)
FAKES: dict[str, tuple[Callable[[Path], FakeCopy], str]] = {
    "cub200": (make_cub, "image_class_labels.txt"),
    "cars196": (make_cars, "cars_annos.mat"),
    "sop": (make_sop, "Ebay_test.txt"),
    "inshop": (make_inshop, "list_eval_partition.txt"),
    "vehicleid": (make_vehicleid, "train_test_split/test_list_800.txt"),
}
KINDS = sorted(FAKES)


@pytest.fixture(params=KINDS)
def kind_fake(request, tmp_path) -> tuple[str, FakeCopy]:
    kind = request.param
    return kind, FAKES[kind][0](tmp_path / "raw")


def test_prepare_writes_manifest_with_expected_counts_and_leaves_copy_untouched(kind_fake, tmp_path):
    kind, fake = kind_fake
    before = snapshot(fake.root)
    manifest = prepare_dataset(fake.config(kind, label="X", recall_ks=[1, 2], training={"epochs": 1}), tmp_path / "out")
    assert snapshot(fake.root) == before
    frame = read_manifest(manifest)
    counts = {s: [len(g), g["label"].nunique()] for s, g in frame.groupby("split")}
    assert counts == fake.expected_counts
    assert all(Path(p).is_absolute() and Path(p).is_relative_to(fake.root) for p in frame["path"])
    assert {str(Path(p).relative_to(fake.root)) for p in frame["path"]} <= set(fake.images)


def test_images_load_as_rgb_whatever_their_mode(kind_fake, tmp_path):
    kind, fake = kind_fake
    for rel, mode in fake.special.items():
        with Image.open(fake.root / rel) as img:
            assert img.mode == mode  # the fake really holds greyscale / CMYK files
    frame = read_manifest(prepare_dataset(fake.config(kind), tmp_path / "out"))
    for path in frame["path"].unique():
        img = load_rgb(path)
        assert img.mode == "RGB"
        assert img.size == fake.images[str(Path(path).relative_to(fake.root))]


def test_missing_list_file_names_file_env_var_and_download(kind_fake, tmp_path):
    kind, fake = kind_fake
    missing = FAKES[kind][1]
    (fake.root / missing).unlink()
    with pytest.raises(DatasetNotFoundError) as err:
        prepare_dataset(fake.config(kind), tmp_path / "out")
    message = str(err.value)
    assert missing.split("/")[-1] in message
    assert f"DMLBENCH_{kind.upper()}_ROOT" in message and "root:" in message
    assert f"dmlbench download {kind}" in message
    assert not (tmp_path / "out" / "manifest.csv").exists()


def test_no_root_configured_says_how_to_set_one(kind_fake, tmp_path, monkeypatch):
    kind, fake = kind_fake
    monkeypatch.delenv(f"DMLBENCH_{kind.upper()}_ROOT", raising=False)
    with pytest.raises(DatasetNotFoundError, match=f"DMLBENCH_{kind.upper()}_ROOT"):
        prepare_dataset({**fake.config(kind), "root": None}, tmp_path / "out")


def test_environment_variable_gives_the_root_when_params_root_is_null(kind_fake, tmp_path, monkeypatch):
    kind, fake = kind_fake
    monkeypatch.setenv(f"DMLBENCH_{kind.upper()}_ROOT", str(fake.root))
    frame = read_manifest(prepare_dataset({**fake.config(kind), "root": None}, tmp_path / "out"))
    assert len(frame) == sum(n for n, _ in fake.expected_counts.values())


def test_wrong_counts_name_file_expected_and_found(kind_fake, tmp_path):
    kind, fake = kind_fake
    split, (n_images, n_classes) = next(iter(fake.expected_counts.items()))
    wrong = {**fake.expected_counts, split: [n_images + 1, n_classes]}
    with pytest.raises(ManifestError) as err:
        prepare_dataset({**fake.config(kind), "expected_counts": wrong}, tmp_path / "out")
    message = str(err.value)
    assert f"{n_images} images / {n_classes} classes" in message  # found
    assert f"expected {n_images + 1} / {n_classes}" in message
    assert str(fake.root) in message  # the list file


def test_pinned_counts_are_asserted_without_override(kind_fake, tmp_path):
    kind, fake = kind_fake
    config = fake.config(kind)
    del config["expected_counts"]
    with pytest.raises(ManifestError, match="expected"):
        prepare_dataset(config, tmp_path / "out")


def test_corrupt_and_missing_images_are_all_reported_by_path(kind_fake, tmp_path):
    kind, fake = kind_fake
    first, second = sorted(fake.images)[:2]
    (fake.root / first).write_bytes(b"not an image at all")
    (fake.root / second).write_bytes(b"")
    with pytest.raises(ImageCheckError) as err:
        prepare_dataset(fake.config(kind, verify_images=True), tmp_path / "out")
    assert str(fake.root / first) in str(err.value) and str(fake.root / second) in str(err.value)
    (fake.root / first).unlink()
    with pytest.raises(ImageCheckError, match="missing"):
        prepare_dataset(fake.config(kind, verify_images=False), tmp_path / "out")


def test_unknown_key_is_rejected_with_the_allowed_ones(kind_fake, tmp_path):
    kind, fake = kind_fake
    with pytest.raises(DatasetConfigError, match=r"unknown params key\(s\) \['rot'\].*allowed"):
        prepare_dataset(fake.config(kind, rot="typo"), tmp_path / "out")


@pytest.mark.parametrize("bad", [{"train": [1]}, {"tain": [1, 1]}, ["train"], {"test": ["a", 1]}])
def test_malformed_expected_counts_override_is_rejected(bad, tmp_path):
    fake = make_cub(tmp_path / "raw")
    with pytest.raises(DatasetConfigError, match="expected_counts"):
        prepare_dataset({**fake.config("cub200"), "expected_counts": bad}, tmp_path / "out")


def test_root_that_is_not_a_directory(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="not a directory"):
        prepare_dataset({"kind": "sop", "root": str(tmp_path / "nowhere")}, tmp_path / "out")


def test_rerun_overwrites_manifest_atomically(tmp_path):
    fake = make_sop(tmp_path / "raw")
    first = prepare_dataset(fake.config("sop"), tmp_path / "out").read_bytes()
    assert prepare_dataset(fake.config("sop"), tmp_path / "out").read_bytes() == first
    # no temporary files left; the marker says that prepare owns the folder
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [OWNER_MARKER, "manifest.csv", "super_classes.csv"]
