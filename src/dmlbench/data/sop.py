"""Stanford Online Products (Oh Song et al., 2016) with its official train/test split.

Reads ``Ebay_train.txt`` and ``Ebay_test.txt`` (header line, then
``image_id class_id super_class_id path``) of the extracted
``Stanford_Online_Products`` folder: 59,551 train images of 11,318 products,
60,502 test images of 11,316 products (class ids 1-11,318 and 11,319-22,634).
The class name is ``<super class folder without _final>/<class_id>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def read_records(root: Path) -> list[Record]:
    """Parse ``Ebay_train.txt`` and ``Ebay_test.txt``; train rows first, in file order."""
    records = []
    for split, name in LIST_FILES.items():
        for _image_id, class_id, _super_id, rel in read_rows(require(root, INFO, name), 4, skip=1):
            super_class = rel.split("/", 1)[0].removesuffix("_final")
            records.append(Record(root / rel, int(class_id), f"{super_class}/{class_id}", split))
    return records


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/manifest.csv`` for SOP (see :mod:`dmlbench.data.official`)."""
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    return write_dataset(
        read_records(root),
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS, INFO),
        sources={split: str(root / name) for split, name in LIST_FILES.items()},
        verify=options["verify_images"],
    )
