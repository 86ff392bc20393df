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

from dmlbench.atomic import atomic_output
from dmlbench.data.download import Archive
from dmlbench.data.official import (
    Counts,
    DatasetInfo,
    Record,
    expected_counts,
    locate_root,
    read_options,
    read_rows,
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


def read_records(root: Path) -> tuple[list[Record], pd.DataFrame]:
    """Parse ``Ebay_train.txt`` and ``Ebay_test.txt``; train rows first, in file order.

    Returns:
        The records and the super class of each class: ``label``, ``group`` (super_class_id),
        ``split``, one row per class in order of first appearance.

    Raises:
        ValueError: a class listed under two super classes (naming the list file).
    """
    records, groups = [], {}
    for split, name in LIST_FILES.items():
        for _image_id, class_id, super_id, rel in read_rows(require(root, INFO, name), 4, skip=1):
            super_class = rel.split("/", 1)[0].removesuffix("_final")
            records.append(Record(root / rel, int(class_id), f"{super_class}/{class_id}", split))
            label, group = int(class_id), int(super_id)
            if groups.setdefault(label, (group, split))[0] != group:
                raise ValueError(f"{root / name}: class {label} has super_class_id {group} and "
                                 f"{groups[label][0]}; the list files are inconsistent (re-extract the release)")
    table = pd.DataFrame([(label, group, split) for label, (group, split) in groups.items()],
                         columns=["label", "group", "split"])
    return records, table


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/super_classes.csv`` and then ``out_dir/manifest.csv`` for SOP (see
    :mod:`dmlbench.data.official`); when the manifest's checks fail, neither file is left."""
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    records, super_classes = read_records(root)
    groups_path = Path(out_dir) / "super_classes.csv"
    with atomic_output(groups_path) as tmp:
        super_classes.to_csv(tmp, index=False, lineterminator="\n")
    try:
        return write_dataset(
            records,
            Path(out_dir),
            info=INFO,
            expected=expected_counts(config, EXPECTED_COUNTS, INFO),
            sources={split: str(root / name) for split, name in LIST_FILES.items()},
            verify=options["verify_images"],
        )
    except BaseException:
        groups_path.unlink(missing_ok=True)
        raise
