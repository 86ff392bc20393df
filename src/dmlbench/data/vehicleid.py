"""PKU VehicleID (Liu et al., 2016): the train list and one of the three test lists.

Reads ``train_test_split/train_list.txt`` and ``test_list_{800,1600,2400}.txt``
(lines ``image_name vehicle_id``; images in ``image/<image_name>.jpg``). The
``test_size`` option picks the test list: ``small`` (800 vehicles),
``medium`` (1,600) or ``large`` (2,400). As in the DML literature (Divide and
Conquer), the whole test list is one ``test`` split for Recall@K (not a
re-identification query/gallery protocol).

The pinned counts are those of the released list files (the dataset's README
says they differ slightly from the paper's, after fake-plate vehicles were
relabelled): train 113,346 images / 13,164 vehicles; test small 6,493 / 800,
medium 13,377 / 1,600, large 19,777 / 2,400. The paper reports 110,178 /
13,134 and 7,332, 12,995, 20,038 images.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dmlbench.data.download import Archive
from dmlbench.data.official import (
    Counts,
    DatasetConfigError,
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
    kind="vehicleid",
    title="PKU VehicleID",
    root_name="VehicleID_V1.0",
    homepage="https://www.pkuml.org/resources/pku-vehicleid.html",
    verify_images=False,
    options={"test_size": "small"},
    manual=(
        "VehicleID is released on request: send the signed agreement from that page to the "
        "maintainers; they reply with a download link. Extract it so that image/, "
        "train_test_split/ and attribute/ sit in one folder."
    ),
)

#: Number of test vehicles of each ``test_size``.
TEST_SIZES: dict[str, int] = {"small": 800, "medium": 1600, "large": 2400}
#: Pinned counts of the released lists, per test size: ``{size: {split: (n_images, n_classes)}}``.
EXPECTED_COUNTS: dict[str, Counts] = {
    "small": {"train": (113346, 13164), "test": (6493, 800)},
    "medium": {"train": (113346, 13164), "test": (13377, 1600)},
    "large": {"train": (113346, 13164), "test": (19777, 2400)},
}

ARCHIVES: list[Archive] = []  # by request only: `dmlbench download vehicleid` explains
ARCHIVE_ROOT = "."


def list_files(test_size: str) -> dict[str, str]:
    """``{split: list file relative to the root}`` for a test size."""
    return {
        "train": "train_test_split/train_list.txt",
        "test": f"train_test_split/test_list_{TEST_SIZES[test_size]}.txt",
    }


def read_records(root: Path, test_size: str) -> list[Record]:
    """Parse the train list and the test list of ``test_size``; train rows first, in file order.

    Raises:
        ManifestError: a bad vehicle id or image name (file and line named).
    """
    records = []
    for split, rel in list_files(test_size).items():
        listing = read_list(require(root, INFO, rel), 2)
        for line, (name, vehicle_id) in listing.rows:
            where = listing.where(line)
            label = parse_id(where, vehicle_id, "vehicle_id", minimum=0)
            path = image_path(root / "image", f"{name}.jpg", where)
            records.append(Record(path, label, vehicle_id, split, source=where))
    return records


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/manifest.csv`` for VehicleID (see :mod:`dmlbench.data.official`).

    Options: ``test_size`` = small (default) | medium | large.
    """
    options = read_options(config, INFO)
    test_size = options["test_size"]
    if test_size not in TEST_SIZES:
        raise DatasetConfigError(f"{INFO.title}: test_size must be one of {list(TEST_SIZES)}, got {test_size!r}")
    root = locate_root(config, INFO)
    return write_dataset(
        read_records(root, test_size),
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS[test_size], INFO),
        sources={split: str(root / rel) for split, rel in list_files(test_size).items()},
        verify=options["verify_images"],
    )
