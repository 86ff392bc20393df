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

import math
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
    image_path,
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
#: The fix named by every error about a damaged or edited ``cars_annos.mat``.
RESTORE_MAT = (
    f"restore cars_annos.mat from the official release (md5 {ARCHIVES[1].md5}; "
    f"`dmlbench download cars196 --archive cars_annos.mat`)"
)


def read_annotations(mat_path: Path) -> tuple[np.ndarray, list[str]]:
    """The ``annotations`` struct array (1-D) and the ``class_names`` of ``cars_annos.mat``.

    Raises:
        ManifestError: not a MATLAB file, a missing variable or field, or class names that are not text.
    """
    try:
        mat = scipy.io.loadmat(mat_path, squeeze_me=True)
    except (scipy.io.matlab.MatReadError, ValueError, OSError, NotImplementedError) as err:
        raise ManifestError(f"{mat_path}: cannot read as a MATLAB file ({err}); {RESTORE_MAT}") from err
    for key in ("annotations", "class_names"):
        if key not in mat:
            found = sorted(k for k in mat if not k.startswith("__"))
            raise ManifestError(f"{mat_path}: no variable {key!r} (found {found}); {RESTORE_MAT}")
    annotations = np.atleast_1d(mat["annotations"])
    missing = [f for f in FIELDS if f not in (annotations.dtype.names or ())]
    if missing:
        raise ManifestError(
            f"{mat_path}: annotations lack field(s) {missing}; found {annotations.dtype.names}; {RESTORE_MAT}"
        )
    class_names = list(np.atleast_1d(mat["class_names"]))
    if not all(isinstance(name, str) and name for name in class_names):
        raise ManifestError(
            f"{mat_path}: class_names must be a cell array of text, found "
            f"{np.asarray(mat['class_names']).dtype} values; {RESTORE_MAT}"
        )
    return annotations, class_names


def _number(entry: np.void, name: str, where: str) -> float:
    """Field ``name`` of one annotation as a finite number (a 1x1 numeric MATLAB value)."""
    value = np.asarray(entry[name])
    if value.size != 1 or value.dtype.kind not in "iuf" or not math.isfinite(float(value.reshape(()))):
        raise ManifestError(
            f"{where}: field {name!r} must be one finite number, found {value.tolist()!r}; {RESTORE_MAT}"
        )
    return float(value.reshape(()))


def _record(root: Path, entry: np.void, class_names: list[str], where: str) -> Record:
    """The :class:`Record` of one annotation; ``where`` names it in errors."""
    cls = _number(entry, "class", where)
    if cls != int(cls) or not 1 <= cls <= len(class_names):
        raise ManifestError(
            f"{where}: class {cls:g} of {entry['relative_im_path']} outside 1..{len(class_names)} "
            f"(the release's class ids are integers 1..196); {RESTORE_MAT}"
        )
    x1, y1, x2, y2 = (_number(entry, f, where) for f in FIELDS[1:5])
    if x2 <= x1 or y2 <= y1:
        raise ManifestError(
            f"{where}: empty or inverted box (x1, y1, x2, y2) = ({x1:g}, {y1:g}, {x2:g}, {y2:g}); {RESTORE_MAT}"
        )
    rel = entry["relative_im_path"]
    if not isinstance(rel, str):
        raise ManifestError(
            f"{where}: relative_im_path must be text, found {np.asarray(rel).tolist()!r}; {RESTORE_MAT}"
        )
    label = int(cls)
    split = "train" if label <= LAST_TRAIN_CLASS else "test"
    return Record(
        image_path(root, rel, where), label, class_names[label - 1], split, (x1, y1, x2 - x1, y2 - y1), source=where
    )


def read_records(root: Path) -> list[Record]:
    """Parse ``cars_annos.mat`` of an extracted Cars196 folder.

    Returns:
        One :class:`Record` per annotation, in file order, with the class id
        (1..196) as label and ``class_names[class - 1]`` as name; errors name
        an annotation by its 1-based index in the file.
    """
    mat_path = require(root, INFO, "cars_annos.mat")
    annotations, class_names = read_annotations(mat_path)
    return [
        _record(root, entry, class_names, f"{mat_path}: annotation {i}") for i, entry in enumerate(annotations, start=1)
    ]


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
