"""The real CUB-200-2011, when a copy is on disk (skipped otherwise).

Looked for in $DMLBENCH_CUB200_ROOT, then <repo>/../shared/datasets/cub200/CUB_200_2011,
then /work/shared/datasets/cub200/CUB_200_2011.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from dmlbench.data import cub200
from dmlbench.data.images import load_rgb, parse_bbox
from dmlbench.data.manifest import read_manifest

CANDIDATES = [
    os.environ.get("DMLBENCH_CUB200_ROOT"),
    Path(__file__).resolve().parents[1].parent / "shared/datasets/cub200/CUB_200_2011",
    "/work/shared/datasets/cub200/CUB_200_2011",
]
ROOT = next((Path(c) for c in CANDIDATES if c and (Path(c) / "images.txt").is_file()), None)

pytestmark = [
    pytest.mark.realdata,
    pytest.mark.skipif(ROOT is None, reason="no local copy of CUB-200-2011 (set DMLBENCH_CUB200_ROOT)"),
]


def _stats(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> tuple:
    before = _stats(ROOT)
    path = cub200.prepare({"kind": "cub200", "root": str(ROOT)}, tmp_path_factory.mktemp("cub") / "out")
    assert _stats(ROOT) == before, "prepare modified the local copy"
    return read_manifest(path)


def test_zero_shot_split_counts(manifest):
    counts = {s: (len(g), g["label"].nunique()) for s, g in manifest.groupby("split")}
    assert counts == {"train": (5864, 100), "test": (5924, 100)}
    assert set(manifest.loc[manifest["split"] == "train", "label"]) == set(range(1, 101))
    assert set(manifest.loc[manifest["split"] == "test", "label"]) == set(range(101, 201))
    assert manifest.loc[manifest["label"] == 1, "class_name"].iloc[0] == "001.Black_footed_Albatross"


def test_greyscale_images_load_as_rgb_and_boxes_fit_their_images(manifest):
    greyscale, overshoot = [], {}
    for path, bbox in zip(manifest["path"], manifest["bbox"]):
        with Image.open(path) as img:
            mode, (width, height) = img.mode, img.size
        if mode != "RGB":
            greyscale.append(path)
        x, y, w, h = parse_bbox(bbox)
        assert 0 <= x < width and 0 <= y < height and w > 0 and h > 0, path
        excess = max(x + w - width, y + h - height)
        if excess > 1:  # beyond rounding
            overshoot[Path(path).name] = excess
    assert len(greyscale) == 8
    for path in greyscale:
        img = load_rgb(path)
        assert img.mode == "RGB" and img.getbands() == ("R", "G", "B")
    # The official annotations overshoot their image by a few px in a handful of images
    # (up to ~12.6 px in this copy); crops are clamped to the image.
    assert len(overshoot) <= 5 and max(overshoot.values(), default=0) < 13, overshoot
