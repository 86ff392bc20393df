"""CUB-200-2011 (Wah et al., 2011) with the zero-shot split of the DML literature.

Reads ``images.txt``, ``image_class_labels.txt``, ``classes.txt`` and
``bounding_boxes.txt`` of the official release; classes 1-100 are ``train``
(5,864 images), classes 101-200 ``test`` (5,924). ``train_test_split.txt`` is
the *classification* split (5,994/5,794 images over all 200 classes) and is
deliberately not read.

Bounding boxes are ``x y w h`` in pixels (floats) as in ``bounding_boxes.txt``;
a few of them reach up to ~13 px beyond their image, and crops are clamped to
the image.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.data.download import Archive
from dmlbench.data.manifest import ManifestError
from dmlbench.data.official import (
    RESTORE,
    Counts,
    DatasetInfo,
    ListFile,
    Record,
    expected_counts,
    locate_root,
    parse_id,
    read_list,
    read_numbers,
    read_options,
    require,
    write_dataset,
)

INFO = DatasetInfo(
    kind="cub200",
    title="CUB-200-2011",
    root_name="CUB_200_2011",
    homepage="https://www.vision.caltech.edu/datasets/cub_200_2011/",
    verify_images="decode",  # small enough to decode every image in prepare (~10-20 s)
    options={"cropped": False},
)

#: Pinned content of the zero-shot split: ``{split: (n_images, n_classes)}``.
EXPECTED_COUNTS: Counts = {"train": (5864, 100), "test": (5924, 100)}
#: Class ids 1..100 train; the rest (101..200) test.
LAST_TRAIN_CLASS = 100

ARCHIVES: list[Archive] = [
    Archive(
        "CUB_200_2011.tgz",
        sha256="0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
        md5="97eceeb196236b17998738112f37df78",
        urls=[
            "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
            "https://s3.amazonaws.com/fast-ai-imageclas/CUB_200_2011.tgz",
            "https://drive.usercontent.google.com/download?id=1hbzc_P1FuxMkcabkgn9ZKinBwW683j45&export=download&confirm=t",
        ],
    )
]
#: Where the dataset root lies inside the extracted archives.
ARCHIVE_ROOT = "CUB_200_2011"

FILES = ("images.txt", "image_class_labels.txt", "classes.txt", "bounding_boxes.txt")


def _ids_once(listing: ListFile, what: str) -> dict[str, tuple[int, list[str]]]:
    """``{first cell: (line, cells)}`` of a list file whose first column is an id listed once.

    Raises:
        ManifestError: an id on two lines (both named).
    """
    first_line: dict[str, int] = {}
    for line, cells in listing.rows:
        if cells[0] in first_line:
            raise ManifestError(
                f"{listing.where(line)}: {what} {cells[0]} is listed again (first on line "
                f"{first_line[cells[0]]}); {RESTORE}"
            )
        first_line[cells[0]] = line
    return {cells[0]: (line, cells) for line, cells in listing.rows}


def _box(listing: ListFile, line: int, cells: list[str]) -> tuple[float, float, float, float]:
    """``(x, y, w, h)`` of a ``bounding_boxes.txt`` row: finite, with positive width and height."""
    box = read_numbers(listing.where(line), cells[1:5])
    if box[2] <= 0 or box[3] <= 0:
        raise ManifestError(
            f"{listing.where(line)}: box width and height must be positive, found {cells[1:5]}; {RESTORE}"
        )
    x, y, width, height = box
    return x, y, width, height


def read_records(root: Path) -> list[Record]:
    """Parse the official list files of an extracted CUB_200_2011 folder.

    Returns:
        One :class:`Record` per line of ``images.txt``, in file order, with
        the class id as label, ``classes.txt``'s name (e.g.
        ``001.Black_footed_Albatross``), the bounding box, and its ``images.txt`` line as source.

    Raises:
        ManifestError: naming the list file, its line and the fix, for a malformed or missing row.
    """
    images, labels, classes, boxes = (
        read_list(require(root, INFO, name), n_columns) for name, n_columns in zip(FILES, (2, 2, 2, 5), strict=True)
    )
    class_names = {class_id: cells[1] for class_id, (_, cells) in _ids_once(classes, "class id").items()}
    label_of = _ids_once(labels, "image id")
    box_of = _ids_once(boxes, "image id")
    listed_as = _ids_once(images, "image id")
    first_id_of: dict[str, str] = {}
    for image_id, (line, (_, rel)) in listed_as.items():
        if rel in first_id_of:
            raise ManifestError(
                f"{images.where(line)}: image {rel} is listed again, under id {image_id} (first "
                f"under id {first_id_of[rel]}); each file is one image: {RESTORE}"
            )
        first_id_of[rel] = image_id
    records = []
    for image_id, (line, (_, rel)) in listed_as.items():
        for table, listing in ((label_of, labels), (box_of, boxes)):
            if image_id not in table:
                raise ManifestError(
                    f"{listing.path}: no entry for image id {image_id} ({images.where(line)}); {RESTORE}"
                )
        label_line, (_, class_id) = label_of[image_id]
        label = parse_id(labels.where(label_line), class_id, "class_id")
        if class_id not in class_names:
            raise ManifestError(f"{labels.where(label_line)}: class {class_id} is not in {classes.path}; {RESTORE}")
        split = "train" if label <= LAST_TRAIN_CLASS else "test"
        records.append(
            Record(
                root / "images" / rel,
                label,
                class_names[class_id],
                split,
                _box(boxes, *box_of[image_id]),
                source=images.where(line),
            )
        )
    return records


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/manifest.csv`` for CUB-200-2011 (see :mod:`dmlbench.data.official`).

    Options: ``cropped`` (default false) writes the bounding-box crops under
    ``out_dir/images/`` and points the manifest at them.
    """
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    records = read_records(root)
    source = f"{root / 'images.txt'} + image_class_labels.txt"
    return write_dataset(
        records,
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS, INFO),
        sources={"train": source, "test": source},
        verify=options["verify_images"],
        crop_base=root / "images" if options["cropped"] else None,
    )
