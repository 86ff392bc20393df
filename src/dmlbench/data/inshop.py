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
    RESTORE,
    Counts,
    DatasetInfo,
    Record,
    expected_counts,
    image_path,
    locate_root,
    parse_item_id,
    read_list,
    read_options,
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
#: The second line of the list file.
HEADER = "image_name item_id evaluation_status"

ARCHIVES: list[Archive] = []  # Google Drive + password only: `dmlbench download inshop` explains
ARCHIVE_ROOT = "."


def partition_file(root: Path) -> Path:
    """``list_eval_partition.txt`` in the root or in ``Eval/``."""
    return require(root, INFO, "list_eval_partition.txt", "Eval/list_eval_partition.txt")


def read_records(root: Path) -> list[Record]:
    """Parse ``list_eval_partition.txt``; rows in file order.

    Raises:
        ManifestError: the first line is not the number of rows that follow, the second not the
            header, or a row has a bad item id, image name or status (file and line named).
    """
    listing = read_list(partition_file(root), 3, n_head=2)
    image_base = require(root, INFO, "img", "Img/img").parent
    (count_line, declared), _ = listing.head
    if not (declared.isascii() and declared.isdigit()):
        raise ManifestError(
            f"{listing.where(count_line)}: expected the number of images, found {declared[:80]!r}; {RESTORE}"
        )
    listing.check_header(HEADER)
    if int(declared) != len(listing.rows):
        raise ManifestError(
            f"{listing.path}: first line says {declared!r} images, the file lists "
            f"{len(listing.rows)} (lines {listing.rows[0][0]}-{listing.rows[-1][0]}); {RESTORE}"
        )
    records = []
    for line, (name, item_id, status) in listing.rows:
        where = listing.where(line)
        if status not in STATUSES:
            raise ManifestError(
                f"{where}: {name} has evaluation_status {status!r}, not one of {sorted(STATUSES)}; {RESTORE}"
            )
        label = parse_item_id(where, item_id)
        records.append(Record(image_path(image_base, name, where), label, item_id, status, source=where))
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
