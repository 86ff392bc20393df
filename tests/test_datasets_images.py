"""Image helpers: RGB loading of every mode, header checks, bbox crops."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from dmlbench.data.images import (
    ImageCheckError,
    crop_box,
    format_bbox,
    load_rgb,
    parse_bbox,
    raise_for_failures,
    save_crop,
    unreadable_images,
)


@pytest.mark.parametrize(
    ("mode", "suffix"),
    [
        ("L", ".jpg"),
        ("CMYK", ".jpg"),
        ("RGB", ".png"),
        ("RGBA", ".png"),
        ("LA", ".png"),
        ("P", ".png"),
        ("I;16", ".png"),
        ("1", ".png"),
    ],
)
def test_load_rgb_converts_every_mode(tmp_path, mode, suffix):
    path = tmp_path / f"img{suffix}"
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 256, (9, 13, 3), dtype=np.uint8), "RGB")
    img = rgb.convert(mode)
    if mode == "P":
        img.info["transparency"] = 0
    img.save(path)
    with Image.open(path) as check:
        assert check.mode == mode
    loaded = load_rgb(path)
    assert loaded.mode == "RGB" and loaded.size == (13, 9)


def test_cmyk_jpeg_colours_survive(tmp_path):
    path = tmp_path / "red.jpg"
    Image.new("RGB", (8, 8), (255, 0, 0)).convert("CMYK").save(path, quality=100)
    r, g, b = load_rgb(path).getpixel((4, 4))
    assert r > 200 and g < 60 and b < 60


def test_unreadable_images_lists_each_failure(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (4, 4)).save(good)
    (tmp_path / "bad.jpg").write_bytes(b"\x00" * 10)
    failures = unreadable_images([good, tmp_path / "bad.jpg", tmp_path / "absent.jpg"])
    assert [p for p, _ in failures] == [str(tmp_path / "bad.jpg"), str(tmp_path / "absent.jpg")]
    with pytest.raises(ImageCheckError, match=r"2 image\(s\) missing or unreadable:\n  .*bad.jpg: "):
        raise_for_failures(failures, "fake")


def test_long_failure_lists_are_summarised():
    failures = [(f"/x/{i}.jpg", "missing") for i in range(150)]
    with pytest.raises(ImageCheckError, match=r"(?s)150 image\(s\).*/x/99.jpg: missing\n  \.\.\. and 50 more$"):
        raise_for_failures(failures, "fake")


def test_bbox_text_round_trip():
    assert format_bbox((28.7, 12.9, 155.0, 145.25)) == "28.7 12.9 155 145.25"
    assert parse_bbox("28.7 12.9 155 145.25") == (28.7, 12.9, 155.0, 145.25)


@pytest.mark.parametrize(
    ("bbox", "box"),
    [
        ((2, 3, 10, 5), (2, 3, 12, 8)),  # inside: exactly the bbox
        ((2.4, 2.6, 10.2, 4.9), (2, 3, 13, 8)),  # rounded
        ((-3, 1, 40, 50), (0, 1, 20, 10)),  # clamped to the 20x10 image
        ((25, 12, 5, 5), (19, 9, 20, 10)),
    ],  # outside: one pixel kept
)
def test_crop_box(bbox, box):
    assert crop_box(bbox, (20, 10)) == box


def test_save_crop_writes_rgb_of_bbox_size(tmp_path):
    src = tmp_path / "grey.jpg"
    Image.new("L", (30, 20), 128).save(src)
    save_crop(src, (5, 4, 12, 9), tmp_path / "out" / "sub" / "crop.jpg")
    with Image.open(tmp_path / "out" / "sub" / "crop.jpg") as crop:
        assert crop.size == (12, 9) and crop.mode == "RGB"
