"""DeepFashion In-shop Clothes Retrieval (Liu et al., 2016): train / query / gallery.

Reads ``list_eval_partition.txt`` (first line: number of images; second: the
header ``image_name item_id evaluation_status``; then one image per line) from
the root or its ``Eval/`` folder, as in the official Google Drive folder.
Image names (``img/WOMEN/Dresses/id_00000002/02_1_front.jpg``) are relative
to the folder holding ``img/``: the root, or ``Img/`` as in the Drive folder.

Splits: 25,882 ``train`` images of 3,997 items; 14,218 ``query`` and 12,612
``gallery`` images of the same 3,985 items. Label = the number of the item
id (``id_00000002`` -> 2), class name = the item id.
"""

from __future__ import annotations

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
    read_options,
    read_rows,
    require,
    write_dataset,
)

INFO = DatasetInfo(
    kind="inshop",
    title="In-Shop Clothes Retrieval",
    root_name="In-shop Clothes Retrieval Benchmark",
    homepage="https://mmlab.ie.cuhk.edu.hk/projects/DeepFashion/InShopRetrieval.html",
    verify_images=False,
    manual=(
        "DeepFashion is distributed through a Google Drive folder linked from that page (the "
        "In-shop Clothes Retrieval Benchmark); image archives there may be password-protected, the "
        "password comes with the signed agreement linked from that page. Download Img/img.zip and "
        "Eval/list_eval_partition.txt, unzip img.zip so that img/ sits next to the list file "
        "(or keep the Drive layout Img/img/ + Eval/)."
    ),
)

#: Pinned content of the official split: ``{split: (n_images, n_classes)}``.
EXPECTED_COUNTS: Counts = {"train": (25882, 3997), "query": (14218, 3985), "gallery": (12612, 3985)}
#: The ``evaluation_status`` values and the manifest split each becomes.
STATUSES: frozenset[str] = frozenset({"train", "query", "gallery"})

ARCHIVES: list[Archive] = []  # Google Drive + password only: `dmlbench download inshop` explains
ARCHIVE_ROOT = "."


def partition_file(root: Path) -> Path:
    """``list_eval_partition.txt`` in the root or in ``Eval/``."""
    return require(root, INFO, "list_eval_partition.txt", "Eval/list_eval_partition.txt")


def read_records(root: Path) -> list[Record]:
    """Parse ``list_eval_partition.txt``; rows in file order.

    Raises:
        ManifestError: the first line is not the number of rows that follow,
            or a status is not train/query/gallery.
    """
    listing = partition_file(root)
    image_base = require(root, INFO, "img", "Img/img").parent
    with open(listing, encoding="utf-8") as f:
        declared = f.readline().strip()
    rows = read_rows(listing, 3, skip=2)
    if declared != str(len(rows)):
        raise ManifestError(f"{listing}: first line says {declared!r} images, the file lists {len(rows)}")
    records = []
    for name, item_id, status in rows:
        if status not in STATUSES:
            raise ManifestError(f"{listing}: {name} has evaluation_status {status!r}, not one of {sorted(STATUSES)}")
        label = int(item_id.removeprefix("id_"))
        records.append(Record(image_base / name, label, item_id, status))
    return records


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/manifest.csv`` for In-Shop (see :mod:`dmlbench.data.official`)."""
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    records = read_records(root)
    source = str(partition_file(root))
    return write_dataset(
        records,
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS, INFO),
        sources={split: source for split in STATUSES},
        verify=options["verify_images"],
    )
