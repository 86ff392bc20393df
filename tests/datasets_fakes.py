"""Miniature fake copies of the official datasets, in their official layouts.

Each ``make_<kind>(root)`` writes tiny images (a few px) of a handful of
classes plus the list files in exactly the official format (for Cars196 the
``cars_annos.mat`` written with scipy.io.savemat as a 1xN struct array and a
1x196 cell array, like the real file), and returns a :class:`FakeCopy` whose
``expected_counts`` is the override that lets ``prepare`` run through the
same code path as on the real data.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.io
from PIL import Image


@dataclass
class FakeCopy:
    """A fake dataset on disk.

    Attributes:
        root: the folder to give to ``prepare`` as ``root``.
        expected_counts: ``{split: [n_images, n_classes]}`` of the fake.
        images: relative path (from ``root``) -> ``(width, height)`` of every image.
        bboxes: relative path -> ``(x, y, w, h)`` for the datasets with boxes.
        special: relative paths of the greyscale (``"L"``) and CMYK (``"CMYK"``) images.
    """

    root: Path
    expected_counts: dict[str, list[int]]
    images: dict[str, tuple[int, int]] = field(default_factory=dict)
    bboxes: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    special: dict[str, str] = field(default_factory=dict)

    def config(self, kind: str, **extra: Any) -> dict[str, Any]:
        """A params section for this fake (``root`` + ``expected_counts`` + ``extra``)."""
        return {"kind": kind, "root": str(self.root), "expected_counts": self.expected_counts, **extra}


def write_image(path: Path, size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> None:
    """A small noise image of ``size`` = (width, height) in ``mode``; format from the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").convert(mode).save(path)


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """``{relative path: (sha256 of bytes, mtime_ns)}`` of every file and folder under ``root``."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            state[str(path.relative_to(root))] = (digest, path.stat().st_mtime_ns)
    return state


def _sizes(n: int, seed: int) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(20, 33)), int(rng.integers(16, 29))) for _ in range(n)]


def _bbox(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """An integer box well inside an image of ``size``: (x, y, w, h)."""
    w, h = size
    return 2, 3, w - 6, h - 5


CUB_CLASSES = (1, 2, 3, 101, 102, 150)


def make_cub(root: Path, per_class: int = 3) -> FakeCopy:
    """``CUB_200_2011/`` with classes 1-3 (train) and 101, 102, 150 (test); one L and one CMYK image."""
    root = root / "CUB_200_2011"
    fake = FakeCopy(root, {"train": [3 * per_class, 3], "test": [3 * per_class, 3]})
    images, labels, boxes = [], [], []
    sizes = iter(_sizes(len(CUB_CLASSES) * per_class, seed=1))
    for cid in CUB_CLASSES:
        for k in range(per_class):
            image_id = len(images) + 1
            rel = f"{cid:03d}.Bird_{cid}/Bird_{cid}_{k:04d}_{image_id}.jpg"
            size = next(sizes)
            mode = {1: "L", 4: "CMYK"}.get(image_id, "RGB")
            write_image(root / "images" / rel, size, mode, seed=image_id)
            key = f"images/{rel}"
            fake.images[key], fake.bboxes[key] = size, _bbox(size)
            if mode != "RGB":
                fake.special[key] = mode
            images.append(f"{image_id} {rel}")
            labels.append(f"{image_id} {cid}")
            boxes.append(f"{image_id} " + " ".join(f"{v:.1f}" for v in _bbox(size)))
    (root / "images.txt").write_text("\n".join(images) + "\n")
    (root / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (root / "bounding_boxes.txt").write_text("\n".join(boxes) + "\n")
    (root / "classes.txt").write_text("".join(f"{cid} {cid:03d}.Bird_{cid}\n" for cid in CUB_CLASSES))
    (root / "train_test_split.txt").write_text("".join(f"{i + 1} {i % 2}\n" for i in range(len(images))))
    return fake


CARS_CLASSES = (1, 2, 98, 99, 150, 196)


def make_cars(root: Path, per_class: int = 3) -> FakeCopy:
    """``cars196/`` with ``car_ims/`` and ``cars_annos.mat``; classes 1, 2, 98 train, 99, 150, 196 test."""
    root = root / "cars196"
    fake = FakeCopy(root, {"train": [3 * per_class, 3], "test": [3 * per_class, 3]})
    dtype = [(name, "O") for name in ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")]
    rows = []
    sizes = iter(_sizes(len(CARS_CLASSES) * per_class, seed=2))
    for cid in CARS_CLASSES:
        for k in range(per_class):
            n = len(rows) + 1
            rel = f"car_ims/{n:06d}.jpg"
            size = next(sizes)
            mode = {2: "L", 5: "CMYK"}.get(n, "RGB")
            write_image(root / rel, size, mode, seed=n)
            x, y, w, h = _bbox(size)
            fake.images[rel], fake.bboxes[rel] = size, (x, y, w, h)
            if mode != "RGB":
                fake.special[rel] = mode
            row = (
                np.array([rel]),
                *(np.array([[v]], dtype=np.uint16) for v in (x, y, x + w, y + h, cid)),
                np.array([[k % 2]], dtype=np.uint8),
            )
            rows.append(row)
    annotations = np.empty((1, len(rows)), dtype=dtype)
    for i, row in enumerate(rows):
        annotations[0, i] = row
    class_names = np.empty((1, 196), dtype=object)
    for i in range(196):
        class_names[0, i] = f"Make{i + 1} Model {2000 + i % 13}"
    scipy.io.savemat(root / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return fake


def make_sop(root: Path, per_class: int = 2) -> FakeCopy:
    """``Stanford_Online_Products/`` with classes 1-4 in Ebay_train.txt and 5-8 in Ebay_test.txt."""
    root = root / "Stanford_Online_Products"
    fake = FakeCopy(root, {"train": [4 * per_class, 4], "test": [4 * per_class, 4]})
    image_id = 0
    for split, classes in (("train", range(1, 5)), ("test", range(5, 9))):
        lines = ["image_id class_id super_class_id path"]
        for cid in classes:
            super_id, super_name = (1, "bicycle_final") if cid % 2 else (2, "chair_final")
            for k in range(per_class):
                image_id += 1
                rel = f"{super_name}/{111085122800 + cid}_{k}.JPG"
                size = (24, 20)
                mode = {3: "L", 6: "CMYK"}.get(image_id, "RGB")
                write_image(root / rel, size, mode, seed=image_id)
                fake.images[rel] = size
                if mode != "RGB":
                    fake.special[rel] = mode
                lines.append(f"{image_id} {cid} {super_id} {rel}")
        (root / f"Ebay_{split}.txt").write_text("\n".join(lines) + "\n")
    return fake


def make_inshop(root: Path, drive_layout: bool = False) -> FakeCopy:
    """In-Shop with items 1-4 train and 5-8 in both query and gallery.

    ``drive_layout`` puts the list in ``Eval/`` and the images under
    ``Img/img/`` as in the official Google Drive folder; otherwise both sit
    in the root.
    """
    root = root / "In-shop Clothes Retrieval Benchmark"
    image_base, listing = (root / "Img", root / "Eval") if drive_layout else (root, root)
    fake = FakeCopy(root, {"train": [8, 4], "query": [8, 4], "gallery": [4, 4]})
    rows = []
    for item in range(1, 9):
        item_id = f"id_{item:08d}"
        statuses = ["train", "train"] if item <= 4 else ["query", "query", "gallery"]
        for k, status in enumerate(statuses):
            rel = f"img/WOMEN/Dresses/{item_id}/{k + 1:02d}_1_front.jpg"
            write_image(image_base / rel, (18, 26), seed=len(rows))
            fake.images[str((image_base / rel).relative_to(root))] = (18, 26)
            rows.append(f"{rel:<60} {item_id} {status}")
    listing.mkdir(parents=True, exist_ok=True)
    (listing / "list_eval_partition.txt").write_text(
        f"{len(rows)}\nimage_name item_id evaluation_status\n" + "\n".join(rows) + "\n"
    )
    return fake


#: Vehicles of each test list of the fake: the small list is a subset of the medium, etc.
VEHICLEID_TEST = {"small": (10, 11), "medium": (10, 11, 12), "large": (10, 11, 12, 13)}


def make_vehicleid(root: Path) -> FakeCopy:
    """``VehicleID_V1.0/`` with vehicles 1-4 (2 images each) in train_list.txt, 10-13 in the test lists.

    ``expected_counts`` is that of the ``small`` list; :func:`vehicleid_counts`
    gives the others.
    """
    root = root / "VehicleID_V1.0"
    fake = FakeCopy(root, vehicleid_counts("small"))

    def lines(vehicles: tuple[int, ...], per_vehicle: int) -> str:
        out = []
        for vid in vehicles:
            for k in range(per_vehicle):
                name = f"{vid * 100 + k:07d}"
                if f"image/{name}.jpg" not in fake.images:
                    write_image(root / "image" / f"{name}.jpg", (30, 22), seed=vid * 100 + k)
                    fake.images[f"image/{name}.jpg"] = (30, 22)
                out.append(f"{name} {vid}\n")
        return "".join(out)

    split_dir = root / "train_test_split"
    split_dir.mkdir(parents=True)
    (split_dir / "train_list.txt").write_text(lines((1, 2, 3, 4), 2))
    for size, n in (("small", 800), ("medium", 1600), ("large", 2400)):
        (split_dir / f"test_list_{n}.txt").write_text(lines(VEHICLEID_TEST[size], 3))
    return fake


def vehicleid_counts(test_size: str) -> dict[str, list[int]]:
    """The ``expected_counts`` of the fake VehicleID for a test size."""
    vehicles = VEHICLEID_TEST[test_size]
    return {"train": [8, 4], "test": [3 * len(vehicles), len(vehicles)]}
