"""Tests of the generated ``synthetic`` dataset (tiny configurations, except for the default class table)."""

from __future__ import annotations

import hashlib
import io
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from dmlbench.data.images import parse_bbox
from dmlbench.data.manifest import read_manifest
from dmlbench.data.registry import prepare_dataset
from dmlbench.data.synthetic import (
    ATTRIBUTES,
    DEFAULTS,
    encode_png,
    make_class_table,
    parse_config,
    prepare,
)
from dmlbench.data.synthetic_render import PART_NAMES, Part, RenderParams, render_image

TINY = {"num_classes": 8, "images_per_class": 3, "image_size": 32}


def _digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, keyed by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _attribute_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c.rsplit("_", 1)[-1] in ATTRIBUTES]


def _one_attribute_pairs(table: pd.DataFrame) -> list[tuple[int, int]]:
    """Label pairs whose attributes differ in exactly one column."""
    values = table[_attribute_columns(table)].to_numpy()
    return [
        (int(table.label[i]), int(table.label[j]))
        for i, j in combinations(range(len(table)), 2)
        if int((values[i] != values[j]).sum()) == 1
    ]


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path: Path) -> None:
    prepare(TINY, tmp_path / "a")
    prepare(TINY, tmp_path / "b")
    prepare({**TINY, "seed": 1}, tmp_path / "c")
    a, b, c = (_digests(tmp_path / d) for d in "abc")
    assert len(a) == 8 * 3 + 2
    assert a == b
    shared = set(a) & set(c)
    assert all(a[k] != c[k] for k in shared if k.endswith(".png"))


def test_rerun_removes_stale_files_and_reproduces_bytes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_dataset({"kind": "synthetic", **TINY, "num_classes": 10, "images_per_class": 4}, out)
    (out / "images" / "stray.txt").write_text("stale")
    (tmp_path / ".out.build-host-999abc").mkdir()  # as left by an interrupted run
    prepare_dataset({"kind": "synthetic", **TINY}, out)
    prepare_dataset({"kind": "synthetic", **TINY}, tmp_path / "fresh")
    assert _digests(out) == _digests(tmp_path / "fresh")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".fresh.lock", ".out.lock", "fresh", "out"]


def test_manifest_counts_splits_and_images(tmp_path: Path) -> None:
    config = {**TINY, "num_classes": 6, "images_per_class": 2}
    manifest = read_manifest(prepare_dataset({"kind": "synthetic", "recall_ks": [1], **config}, tmp_path))
    assert len(manifest) == 6 * 2
    assert sorted(manifest.loc[manifest.split == "train", "label"].unique()) == [0, 1, 2]
    assert sorted(manifest.loc[manifest.split == "test", "label"].unique()) == [3, 4, 5]
    for path in manifest.path:
        with Image.open(path) as image:
            assert (image.mode, image.size) == ("RGB", (32, 32))
    classes = pd.read_csv(tmp_path / "classes.csv")
    names = manifest.groupby("label")["class_name"].first()
    assert names.to_dict() == dict(zip(classes.label, classes.class_name))
    assert all(Path(p).parent.name.startswith(f"{lab:03d}_") for p, lab in zip(manifest.path, manifest.label))


def test_default_class_table_is_fine_grained_within_each_half() -> None:
    table = make_class_table({})
    assert list(table.label) == list(range(100))
    assert (table.split == np.where(table.label < 50, "train", "test")).all()
    columns = _attribute_columns(table)
    assert columns == [f"{p}_{a}" for p in PART_NAMES for a in ATTRIBUTES]
    assert not table.duplicated(subset=columns).any()
    assert table.class_name.is_unique
    assert table.groupby("family")["split"].nunique().max() == 1
    family = dict(zip(table.label, table.family))
    pairs = _one_attribute_pairs(table)
    per_family = pd.Series([family[i] for i, j in pairs if family[i] == family[j]]).value_counts()
    # Each family of 10: a prototype and 6 single mutants (+ 3 double mutants), so >= 6 such pairs inside it.
    assert len(per_family) == 10 and per_family.min() >= 6


def test_class_table_with_three_parts() -> None:
    table = make_class_table({"num_parts": 3, "num_classes": 20, "classes_per_family": 4})
    assert not any(c.startswith("crest_") for c in table.columns)
    assert table.groupby("split")["family"].nunique().to_dict() == {"test": 3, "train": 3}
    assert not table.duplicated(subset=_attribute_columns(table)).any()


def test_foreign_keys_are_ignored_and_unknown_keys_named() -> None:
    parse_config({"kind": "synthetic", "label": "Synthetic", "recall_ks": [1, 2], "training": {}})
    with pytest.raises(ValueError, match="num_class"):
        parse_config({"num_class": 10})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_parts", 7),
        ("image_size", 16),
        ("num_classes", 7),
        ("images_per_class", 0),
        ("scale_range", [1.2, 0.8]),
        ("scale_range", 1.0),
        ("seed", -1),
        ("num_distractors", True),
        ("flip_prob", 1.5),
        ("rotation_deg", "25"),
    ],
)
def test_invalid_values_are_named(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        parse_config({key: value})


def test_defaults_are_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "synthetic.md").read_text()
    assert all(f"`{key}`" in doc for key in DEFAULTS)


def test_png_encoding_round_trips() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 600, 3), dtype=np.uint8)  # > one deflate block
    with Image.open(io.BytesIO(encode_png(pixels))) as image:
        assert image.mode == "RGB"
        assert np.array_equal(np.asarray(image), pixels)


def test_one_part_change_only_changes_that_part() -> None:
    """Same instance randomness, one part attribute changed: the pixels differ only around that part."""
    params = RenderParams(image_size=64, noise_amplitude=0.0)
    base = tuple(Part(p, "circle", "red", "solid") for p in PART_NAMES)
    changed = (Part("head", "square", "red", "solid"), *base[1:])
    a = render_image(base, params, np.random.default_rng(3)).image.astype(int)
    b = render_image(changed, params, np.random.default_rng(3)).image.astype(int)
    rows, cols = np.nonzero(np.abs(a - b).sum(axis=2))
    assert len(rows) > 0
    assert rows.max() - rows.min() < 20 and cols.max() - cols.min() < 20  # a part is ~13 px wide at 64 px


def test_golden_bytes(tmp_path: Path) -> None:
    """Pins the generator's output on every machine: update the digest only when changing the rendering on purpose."""
    prepare(TINY, tmp_path)
    ours = {k: v for k, v in _digests(tmp_path).items() if k != "manifest.csv"}  # manifest.csv: manifest.py's format
    combined = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in ours.items()).encode()).hexdigest()
    assert combined == "49f8e35fc6e19b9596fcb8b63143843248e36644b027a026383d02d941783171"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_box_covers_the_rendered_object(seed: int) -> None:
    """Two classes whose parts differ in colour and texture (same shapes), same instance randomness,
    no distractors: the pixels that differ are the parts; the box holds all of them and is not much
    larger than their extent (the body lies between the parts). The box is the same for both."""
    params = RenderParams(image_size=64, num_distractors=0, noise_amplitude=0.0)
    a = render_image(tuple(Part(p, "circle", "red", "solid") for p in PART_NAMES), params, np.random.default_rng(seed))
    b = render_image(
        tuple(Part(p, "circle", "blue", "checker") for p in PART_NAMES), params, np.random.default_rng(seed)
    )
    rows, cols = np.nonzero(np.abs(a.image.astype(int) - b.image.astype(int)).sum(axis=2))
    x, y, w, h = a.box
    assert a.box == b.box and w > 0 and h > 0
    assert x <= cols.min() and cols.max() < x + w and y <= rows.min() and rows.max() < y + h
    extent = (cols.max() + 1 - cols.min()) * (rows.max() + 1 - rows.min())
    assert w * h <= 1.3 * extent


def test_manifest_carries_each_object_box(tmp_path: Path) -> None:
    manifest = read_manifest(prepare(TINY, tmp_path))
    boxes = np.array([parse_bbox(text) for text in manifest["bbox"]])
    assert boxes.shape == (len(manifest), 4)
    x, y, w, h = boxes.T
    assert (x >= 0).all() and (y >= 0).all() and (x + w <= 32).all() and (y + h <= 32).all()
    assert (w * h > 0.1 * 32 * 32).all() and (w * h < 32 * 32).all()  # an object, not the whole image
    assert len(set(map(tuple, boxes))) > len(boxes) // 2  # follows each instance's pose
