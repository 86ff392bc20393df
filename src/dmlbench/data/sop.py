"""Stanford Online Products (Oh Song et al., 2016) with its official train/test split.

Reads ``Ebay_train.txt`` and ``Ebay_test.txt`` (header line, then
``image_id class_id super_class_id path``) of the extracted
``Stanford_Online_Products`` folder: 59,551 train images of 11,318 products,
60,502 test images of 11,316 products (class ids 1-11,318 and 11,319-22,634).
The class name is ``<super class folder without _final>/<class_id>``.

Besides the manifest, :func:`prepare` writes ``super_classes.csv`` (``label``,
``group`` = the release's ``super_class_id`` 1–12, ``split``), one row per
class: the GT class families of divide-and-conquer's ``grouping:
class_families`` ablation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from dmlbench.data.download import Archive
from dmlbench.data.manifest import ManifestError
from dmlbench.data.official import (
    RESTORE,
    Counts,
    DatasetInfo,
    Record,
    expected_counts,
    image_path,
    locate_root,
    parse_id,
    read_list,
    read_options,
    require,
    write_dataset,
)

INFO = DatasetInfo(
    kind="sop",
    title="Stanford Online Products",
    root_name="Stanford_Online_Products",
    homepage="https://cvgl.stanford.edu/projects/lifted_struct/",
    verify_images=False,
)

#: Pinned content of the official split: ``{split: (n_images, n_classes)}``.
EXPECTED_COUNTS: Counts = {"train": (59551, 11318), "test": (60502, 11316)}
#: The list file of each split.
LIST_FILES: dict[str, str] = {"train": "Ebay_train.txt", "test": "Ebay_test.txt"}

ARCHIVES: list[Archive] = [
    Archive(
        "Stanford_Online_Products.zip",
        sha256=None,
        md5="7f73d41a2f44250d4779881525aea32e",
        urls=[
            "http://ftp.cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
            "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
            "https://drive.usercontent.google.com/download?id=1TclrpQOF_ullUP99wk_gjGN8pKvtErG8&export=download&confirm=t",
        ],
    )
]
#: Where the dataset root lies inside the extracted archives.
ARCHIVE_ROOT = "Stanford_Online_Products"


#: The first line of both list files.
HEADER = "image_id class_id super_class_id path"


def read_records(root: Path) -> tuple[list[Record], pd.DataFrame]:
    """Parse ``Ebay_train.txt`` and ``Ebay_test.txt``; train rows first, in file order.

    Returns:
        The records and the super class of each class: ``label``, ``group`` (super_class_id),
        ``split``, one row per class in order of first appearance.

    Raises:
        ManifestError: a bad header, class id or image path, or a class listed under two super
            classes (naming the list file and line).
    """
    records: list[Record] = []
    groups: dict[int, tuple[int, str, str, str]] = {}
    for split, name in LIST_FILES.items():
        listing = read_list(require(root, INFO, name), 4, n_head=1)
        listing.check_header(HEADER)
        for line, (_image_id, class_id, super_id, rel) in listing.rows:
            where = listing.where(line)
            label = parse_id(where, class_id, "class_id")
            group = parse_id(where, super_id, "super_class_id")
            folder = rel.split("/", 1)[0].removesuffix("_final")
            records.append(Record(image_path(root, rel, where), label, f"{folder}/{label}", split, source=where))
            first = groups.setdefault(label, (group, folder, split, where))
            if first[:2] != (group, folder):
                raise ManifestError(
                    f"{listing.path}: class {label} has super_class_id {group} and {first[0]}, folder "
                    f"{folder!r} and {first[1]!r} ({where} and {first[3]}); a class has one super class: {RESTORE}"
                )
    table = pd.DataFrame(
        [(label, group, split) for label, (group, _, split, _) in groups.items()], columns=["label", "group", "split"]
    )
    return records, table


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/super_classes.csv`` and then ``out_dir/manifest.csv`` for SOP (see
    :mod:`dmlbench.data.official`); when a check fails, neither file is written."""
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    records, super_classes = read_records(root)
    return write_dataset(
        records,
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS, INFO),
        sources={split: str(root / name) for split, name in LIST_FILES.items()},
        verify=options["verify_images"],
        tables={"super_classes.csv": super_classes},
    )
