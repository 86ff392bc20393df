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

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.data.download import Archive
from dmlbench.data.manifest import ManifestError
from dmlbench.data.official import (
    Counts,
    DatasetInfo,
    Record,
    expected_counts,
    locate_root,
    read_numbers,
    read_options,
    read_rows,
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


def read_records(root: Path) -> list[Record]:
    """Parse the official list files of an extracted CUB_200_2011 folder.

    Returns:
        One :class:`Record` per line of ``images.txt``, in file order, with
        the class id as label, ``classes.txt``'s name (e.g.
        ``001.Black_footed_Albatross``) and the bounding box.
    """
    images, labels, classes, boxes = (require(root, INFO, name) for name in FILES)
    class_names = dict(read_rows(classes, 2))
    label_of = dict(read_rows(labels, 2))
    bbox_of = {row[0]: read_numbers(boxes, row, slice(1, 5)) for row in read_rows(boxes, 5)}
    records = []
    image_rows = read_rows(images, 2)
    paths = Counter(rel for _, rel in image_rows)
    repeated = [rel for rel, count in paths.items() if count > 1]
    if repeated:
        ids = [image_id for image_id, rel in image_rows if rel == repeated[0]]
        raise ManifestError(f"{images}: {len(repeated)} image file(s) listed under more than one id, e.g. "
                            f"{repeated[0]} (ids {', '.join(ids)}); each file is one image: restore images.txt "
                            f"from the dataset's archive")
    for image_id, rel in image_rows:
        for table, path in ((label_of, labels), (bbox_of, boxes)):
            if image_id not in table:
                raise ManifestError(f"{path}: no entry for image id {image_id} ({rel}) of {images}")
        class_id = label_of[image_id]
        if class_id not in class_names:
            raise ManifestError(f"{classes}: no class {class_id} (used by image id {image_id} in {labels})")
        label = int(class_id)
        split = "train" if label <= LAST_TRAIN_CLASS else "test"
        records.append(Record(root / "images" / rel, label, class_names[class_id], split, bbox_of[image_id]))
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
