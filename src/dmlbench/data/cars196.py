"""Stanford Cars / Cars196 (Krause et al., 2013) with the zero-shot split of the DML literature.

Reads the 16,185-image release: ``cars_annos.mat`` (struct array
``annotations`` with fields ``relative_im_path``, ``bbox_x1``, ``bbox_y1``,
``bbox_x2``, ``bbox_y2``, ``class``, ``test``, and the cell array
``class_names``) next to the ``car_ims/`` folder. Classes 1-98 are ``train``
(8,054 images), 99-196 ``test`` (8,131); the ``test`` field (the
classification split) is ignored.

The boxes ``(x1, y1, x2, y2)`` become ``x y w h = x1 y1 (x2-x1) (y2-y1)``,
i.e. the crop is ``image.crop((x1, y1, x2, y2))`` as in the DML codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.io

from dmlbench.data.download import Archive
from dmlbench.data.manifest import ManifestError
from dmlbench.data.official import (
    Counts,
    DatasetInfo,
    Record,
    expected_counts,
    locate_root,
    read_options,
    require,
    write_dataset,
)

INFO = DatasetInfo(
    kind="cars196",
    title="Cars196 (Stanford Cars)",
    root_name="cars196",
    homepage="https://ai.stanford.edu/~jkrause/cars/car_dataset.html",
    verify_images="decode",  # small enough to decode every image in prepare (~10-20 s)
    options={"cropped": False},
    manual=(
        "The Stanford AI Lab links have been offline since 2023. A copy of the same release (car_ims/ + "
        "cars_annos.mat, checksum not pinned here) is served by Stanford CVGL as "
        "http://ftp.cs.stanford.edu/cs/cvgl/CARS196.zip; if you have car_ims.tgz, its md5 is "
        "d5c8f0aa497503f355e17dc7886c3f14 and that of cars_annos.mat b407c6086d669747186bd1d764ff9dbc."
    ),
)

#: Pinned content of the zero-shot split: ``{split: (n_images, n_classes)}``.
EXPECTED_COUNTS: Counts = {"train": (8054, 98), "test": (8131, 98)}
#: Class ids 1..98 train; the rest (99..196) test.
LAST_TRAIN_CLASS = 98

_STANFORD = ("http://ai.stanford.edu/~jkrause/car196/", "http://imagenet.stanford.edu/internal/car196/")
ARCHIVES: list[Archive] = [
    Archive(
        name,
        sha256=None,
        md5=md5,
        urls=[base + name for base in _STANFORD] + [f"https://web.archive.org/web/2020id_/{_STANFORD[0]}{name}"],
    )
    for name, md5 in (
        ("car_ims.tgz", "d5c8f0aa497503f355e17dc7886c3f14"),
        ("cars_annos.mat", "b407c6086d669747186bd1d764ff9dbc"),
    )
]
#: Where the dataset root lies inside the extracted archives.
ARCHIVE_ROOT = "."

FIELDS = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class")


def read_records(root: Path) -> list[Record]:
    """Parse ``cars_annos.mat`` of an extracted Cars196 folder.

    Returns:
        One :class:`Record` per annotation, in file order, with the class id
        (1..196) as label and ``class_names[class - 1]`` as name.
    """
    mat_path = require(root, INFO, "cars_annos.mat")
    try:
        mat = scipy.io.loadmat(mat_path, squeeze_me=True)
    except (scipy.io.matlab.MatReadError, ValueError, OSError, NotImplementedError) as err:
        raise ManifestError(f"{mat_path}: cannot read as a MATLAB file ({err})") from err
    for key in ("annotations", "class_names"):
        if key not in mat:
            found = sorted(k for k in mat if not k.startswith("__"))
            raise ManifestError(f"{mat_path}: no variable {key!r} (found {found})")
    annotations = np.atleast_1d(mat["annotations"])
    missing = [f for f in FIELDS if f not in (annotations.dtype.names or ())]
    if missing:
        raise ManifestError(f"{mat_path}: annotations lack field(s) {missing}; found {annotations.dtype.names}")
    class_names = [str(name) for name in np.atleast_1d(mat["class_names"])]
    records = []
    for entry in annotations:
        label = int(entry["class"])
        if not 1 <= label <= len(class_names):
            raise ManifestError(
                f"{mat_path}: class {label} of {entry['relative_im_path']} outside 1..{len(class_names)}"
            )
        x1, y1, x2, y2 = (float(entry[f]) for f in FIELDS[1:5])
        split = "train" if label <= LAST_TRAIN_CLASS else "test"
        path = root / str(entry["relative_im_path"])
        records.append(Record(path, label, class_names[label - 1], split, (x1, y1, x2 - x1, y2 - y1)))
    return records


def prepare(config: Mapping[str, Any], out_dir: Path) -> Path:
    """Write ``out_dir/manifest.csv`` for Cars196 (see :mod:`dmlbench.data.official`).

    Options: ``cropped`` (default false) writes the bounding-box crops under
    ``out_dir/images/`` and points the manifest at them.
    """
    options = read_options(config, INFO)
    root = locate_root(config, INFO)
    records = read_records(root)
    source = str(root / "cars_annos.mat")
    return write_dataset(
        records,
        Path(out_dir),
        info=INFO,
        expected=expected_counts(config, EXPECTED_COUNTS, INFO),
        sources={"train": source, "test": source},
        verify=options["verify_images"],
        crop_base=root if options["cropped"] else None,
    )
