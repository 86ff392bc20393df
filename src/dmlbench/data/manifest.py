"""The canonical manifest: one CSV per prepared dataset.

Every dataset, real or generated, ends in the same format, so nothing
downstream knows where the images came from.

Columns (in this order):

``path``
    Image file, absolute or relative to the directory holding the manifest.
``label``
    Integer class id, unique per class within the dataset (not necessarily
    contiguous; :func:`contiguous_labels` remaps a subset to ``0..C-1``).
``class_name``
    Human-readable class name.
``split``
    One of :data:`SPLITS`. ``val`` is normally carved at training time from
    the ``train`` classes (:mod:`dmlbench.data.splits`); ``query``/``gallery``
    are for retrieval datasets such as In-Shop.
``bbox`` (optional)
    ``"x y w h"`` in pixels of the image file, or empty.

Writes are atomic (temporary file + rename), so an interrupted ``prepare``
never leaves a half-written manifest behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlbench.atomic import atomic_output
from dmlbench.errors import DmlbenchError

SPLITS: tuple[str, ...] = ("train", "val", "test", "query", "gallery")
REQUIRED_COLUMNS: tuple[str, ...] = ("path", "label", "class_name", "split")
OPTIONAL_COLUMNS: tuple[str, ...] = ("bbox",)
#: smallest and largest class id: labels are stored and compared as int64.
LABEL_RANGE: tuple[int, int] = (int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max))


class ManifestError(DmlbenchError, ValueError):
    """A manifest file is missing, malformed, or does not match its expected content."""


def _file_lines(rows: np.ndarray, limit: int = 5) -> str:
    """1-based line numbers in the CSV file (the header is line 1) of 0-based data ``rows``."""
    listed = ", ".join(str(r + 2) for r in rows[:limit])
    return listed + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


#: splits whose classes are learned from; none of their classes may appear in the evaluation splits.
TRAINING_SPLITS: tuple[str, ...] = ("train", "val")


def _exact_integer(cell: Any) -> int | None:
    """A label cell as the exact integer it writes (``"7"``, ``7``, ``"7.0"``, however large), or None for text,
    a blank, a fraction or a non-finite number.

    >>> _exact_integer("99999999999999999999"), _exact_integer(" 7.0 "), _exact_integer("1.5"), _exact_integer("")
    (99999999999999999999, 7, None, None)
    """
    try:
        number = Decimal(str(cell).strip())
    except InvalidOperation:
        return None
    return int(number) if number.is_finite() and number == number.to_integral_value() else None


def _integer_labels(column: pd.Series, source: str | os.PathLike[str]) -> pd.Series:
    """``column`` as int64, refusing text, blanks and fractions (which a plain cast would truncate) and class ids
    outside int64 (which a cast would wrap, merging classes). Each cell is read exactly, never through a float."""
    numbers = pd.to_numeric(column, errors="coerce")
    if numbers.dtype.kind == "i":  # every cell an integer within int64, parsed exactly
        return numbers.astype(np.int64)
    values = [_exact_integer(cell) for cell in column]
    bad = np.flatnonzero([value is None for value in values])
    if len(bad):
        raise ManifestError(
            f"{source}: column 'label' must hold integer class ids; line(s) {_file_lines(bad)} "
            f"hold {column.iloc[bad[0]]!r}. Re-run `dmlbench prepare <dataset>`."
        )
    integers = [value for value in values if value is not None]  # all of them: the check above
    low, high = LABEL_RANGE
    outside = np.flatnonzero([not low <= value <= high for value in integers])
    if len(outside):
        raise ManifestError(
            f"{source}: column 'label' holds {column.iloc[outside[0]]} on line(s) "
            f"{_file_lines(outside)}, outside the 64-bit range of class ids ({low} to {high}); "
            f"number the classes from 0. Re-run `dmlbench prepare <dataset>`."
        )
    return pd.Series(np.array(integers, dtype=np.int64), index=column.index, name=column.name)


def _check_disjoint_classes(labels: pd.Series, splits: pd.Series, source: str | os.PathLike[str]) -> None:
    """Deep metric learning tests on classes never seen in training: refuse a label on both sides."""
    trained = splits.isin(TRAINING_SPLITS).to_numpy()
    shared = np.intersect1d(labels[trained], labels[~trained])
    if len(shared):
        rows = np.flatnonzero(labels.to_numpy() == shared[0])
        raise ManifestError(
            f"{source}: {len(shared)} label(s) appear in both {list(TRAINING_SPLITS)} and the evaluation splits, "
            f"e.g. label {shared[0]} on lines {_file_lines(rows)}; the benchmark's protocol tests on unseen "
            f"classes. Give each class one side, or re-run `dmlbench prepare <dataset>`."
        )


def _box_problem(text: str) -> str | None:
    """What is wrong with one ``bbox`` cell (``"x y w h"`` in pixels, or empty), or None.

    >>> _box_problem(""), _box_problem("1 2 3 4"), _box_problem("1 2 3"), _box_problem("1 2 0 4")
    (None, None, 'not 4 numbers', 'width and height must be positive')
    """
    if not text.strip():
        return None
    try:
        values = [float(v) for v in text.split()]
    except ValueError:
        return "not 4 numbers"
    if len(values) != 4:
        return "not 4 numbers"
    x, y, w, h = values
    if not all(np.isfinite(values)):
        return "non-finite number"
    if x < 0 or y < 0:
        return "x and y must be >= 0 (pixels from the top-left corner)"
    if w <= 0 or h <= 0:
        return "width and height must be positive"
    return None


def _check_boxes(boxes: pd.Series, source: str | os.PathLike[str]) -> None:
    """Every non-empty ``bbox`` is ``"x y w h"``: finite, x, y >= 0, w, h > 0."""
    problems = [_box_problem(text) for text in boxes]
    bad = np.flatnonzero([problem is not None for problem in problems])
    if len(bad):
        raise ManifestError(
            f"{source}: bbox on line(s) {_file_lines(bad)}: {problems[bad[0]]} "
            f"(found {boxes.iloc[bad[0]]!r}); write 'x y w h' in pixels, or leave it empty. "
            f"Re-run `dmlbench prepare <dataset>`."
        )


def validate(frame: pd.DataFrame, source: str | os.PathLike[str] = "<manifest>") -> pd.DataFrame:
    """Check columns, dtypes and split names; return the frame with canonical column order.

    Raises:
        ManifestError: naming ``source`` and the offending column or values.
    """
    if frame.empty:
        raise ManifestError(
            f"{source}: no rows; a manifest lists one image per row. Re-run `dmlbench prepare <dataset>`."
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ManifestError(
            f"{source}: missing column(s) {missing}; a manifest needs {list(REQUIRED_COLUMNS)} "
            f"(+ optional {list(OPTIONAL_COLUMNS)}). Re-run `dmlbench prepare <dataset>`."
        )
    unknown = [c for c in frame.columns if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        raise ManifestError(f"{source}: unknown column(s) {unknown}")
    bad_splits = sorted(set(frame["split"].astype(str)) - set(SPLITS))
    if bad_splits:
        raise ManifestError(f"{source}: unknown split value(s) {bad_splits}; allowed: {list(SPLITS)}")
    paths = frame["path"].astype(str)
    empty = frame["path"].isna().to_numpy() | (paths.str.strip() == "").to_numpy()
    if empty.any():
        raise ManifestError(
            f"{source}: empty 'path' on line(s) {_file_lines(np.flatnonzero(empty))} "
            f"(of {empty.sum()}); every row names one image file"
        )
    repeated = paths.duplicated(keep=False).to_numpy()
    if repeated.any():
        first = paths[repeated].iloc[0]
        raise ManifestError(
            f"{source}: {paths[repeated].nunique()} image path(s) appear more than once, "
            f"e.g. {first!r} on lines {_file_lines(np.flatnonzero(paths == first))}; "
            f"each image belongs to one row (a repeated test image would count as its own nearest neighbour). "
            f"Remove the repeated rows or re-run `dmlbench prepare <dataset>`."
        )
    labels = _integer_labels(frame["label"], source)
    _check_disjoint_classes(labels, frame["split"].astype(str), source)
    names_per_label = frame.groupby(labels)["class_name"].nunique()
    ambiguous = names_per_label[names_per_label > 1]
    if len(ambiguous):
        raise ManifestError(f"{source}: label(s) {list(ambiguous.index[:5])} carry more than one class_name")
    columns = list(REQUIRED_COLUMNS) + [c for c in OPTIONAL_COLUMNS if c in frame.columns]
    out = frame[columns].copy()
    out["label"] = labels
    out["class_name"] = out["class_name"].astype(str)
    out["split"] = out["split"].astype(str)
    if "bbox" in out.columns:
        out["bbox"] = out["bbox"].fillna("").astype(str)
        _check_boxes(out["bbox"], source)
    return out.reset_index(drop=True)


def read_manifest(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read and validate a manifest; relative image paths become absolute.

    Returns:
        DataFrame with the columns of :func:`validate`; ``path`` absolute.
    """
    path = Path(path)
    if not path.is_file():
        raise ManifestError(f"{path}: manifest not found. Run `dmlbench prepare <dataset>` first.")
    frame = pd.read_csv(
        path, dtype={"path": str, "label": str, "class_name": str, "split": str, "bbox": str}, keep_default_na=False
    )  # labels as text: validate reads each exactly
    frame = validate(frame, source=path)
    root = path.parent.resolve()
    frame["path"] = [p if os.path.isabs(p) else str(root / p) for p in frame["path"]]
    return frame


def write_manifest(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Validate and atomically write a manifest CSV (temporary file, then rename)."""
    path = Path(path)
    frame = validate(frame, source=path)
    with atomic_output(path) as tmp:
        frame.to_csv(tmp, index=False, lineterminator="\n")
    return path


def select_splits(frame: pd.DataFrame, splits: Iterable[str]) -> pd.DataFrame:
    """Rows whose ``split`` is in ``splits``, index reset."""
    splits = list(splits)
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ManifestError(f"unknown split(s) {unknown}; allowed: {list(SPLITS)}")
    return frame[frame["split"].isin(splits)].reset_index(drop=True)


def contiguous_labels(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Map arbitrary integer labels to ``0..C-1`` in sorted order.

    Returns:
        ``(mapped, classes)``: ``mapped`` (N,) int64 and ``classes`` (C,) the
        original label of each new id.

    >>> contiguous_labels(np.array([7, 3, 7, 9]))
    (array([1, 0, 1, 2]), array([3, 7, 9]))
    """
    classes, mapped = np.unique(np.asarray(labels), return_inverse=True)
    return mapped.astype(np.int64), classes


def assert_split_counts(frame: pd.DataFrame, expected: dict[str, tuple[int, int]], source: str) -> None:
    """Stop unless every split has exactly the expected (images, classes) counts.

    Args:
        expected: ``{split: (n_images, n_classes)}``.
        source: what to name in the error (dataset name or file).
    """
    for split, (n_images, n_classes) in expected.items():
        rows = frame[frame["split"] == split]
        found = (len(rows), rows["label"].nunique())
        if found != (n_images, n_classes):
            raise ManifestError(
                f"{source}: split '{split}' has {found[0]} images / {found[1]} classes, "
                f"expected {n_images} / {n_classes}. The copy is incomplete or not the official release: "
                f"re-extract it from the official archive."
            )
