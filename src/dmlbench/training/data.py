"""The images a run trains, validates and tests on, built from the manifest and the run's params."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlbench.data.dataset import ImageDataset
from dmlbench.data.image_store import open_store
from dmlbench.data.images import parse_bbox
from dmlbench.data.manifest import ManifestError, contiguous_labels, read_manifest, select_splits
from dmlbench.data.splits import cap_images_per_class, carve_validation
from dmlbench.data.stored_dataset import ImageSet, StoredImageDataset
from dmlbench.data.transforms import eval_transform, training_transform
from dmlbench.settings import TrainingSettings, training_settings

EVAL_SPLITS = ("test", "query", "gallery")


@dataclass
class RunData:
    """Datasets of one run.

    Attributes:
        train: training images (train augmentation), labels remapped to 0..C-1.
        num_classes: C, number of training classes.
        val: validation images (test transform, original labels), or None when ``val_fraction`` is 0.
        test: evaluation images (test transform, original labels); its rows follow ``test_split``.
        test_split: (N_test,) split name of each test row ('test', or 'query'/'gallery').
        train_classes: (C,) the manifest label of each training label 0..C-1.
        train_boxes, val_boxes: (N, 4) float ``(x, y, w, h)`` object boxes in the pixels of each
            row's image file (the manifest's ``bbox``; NaN rows where it is empty), or None when
            the manifest has no ``bbox`` column (or there is no validation split).
    """

    train: ImageSet
    num_classes: int
    val: ImageSet | None
    test: ImageSet
    test_split: np.ndarray
    train_classes: np.ndarray
    train_boxes: np.ndarray | None = None
    val_boxes: np.ndarray | None = None


def manifest_boxes(rows: pd.DataFrame) -> np.ndarray | None:
    """(N, 4) ``(x, y, w, h)`` of the rows' ``bbox`` column, NaN where empty; None without the column.

    >>> manifest_boxes(pd.DataFrame({"bbox": ["1 2 3 4", ""]})).tolist()
    [[1.0, 2.0, 3.0, 4.0], [nan, nan, nan, nan]]
    """
    if "bbox" not in rows.columns:
        return None
    boxes = [parse_bbox(text) if text else (np.nan,) * 4 for text in rows["bbox"]]
    return np.array(boxes, dtype=np.float64).reshape(-1, 4)


def split_seed(val_split_seed: int | str, seed: int) -> int:
    """Seed of the class-disjoint validation split: ``training.val_split_seed``, or the run's ``seed``
    when it is the string ``seed`` (one random class split per run, as DIABLO's §4.2 protocol:
    a table's mean ± std over seeds is then a mean ± std over splits).

    >>> split_seed("seed", 3), split_seed(0, 3)
    (3, 0)
    """
    return int(seed) if val_split_seed == "seed" else int(val_split_seed)


def evaluation_rows(frame: pd.DataFrame, images_per_class: int | None) -> pd.DataFrame:
    """The manifest rows a run embeds for its test metrics, in embedding order: the evaluation
    splits, the first ``images_per_class`` (``training.eval_images_per_class``) images of each class
    when it is set."""
    return cap_images_per_class(select_splits(frame, EVAL_SPLITS), images_per_class)


def load_run_data(run: Mapping[str, Any], manifest_path: str | Path) -> RunData:
    """Read the manifest, carve the validation classes and build the three datasets of the run's
    ``training.pipeline``: ``pil`` (files decoded and transformed per item by the loader; decoded train
    and validation images kept in memory with ``cache_images``) or ``decoded_uint8`` (uint8 images of
    the dataset's :mod:`~dmlbench.data.image_store`, augmented on the training device).

    ``training.eval_images_per_class`` (None: all) keeps the first N images of each validation
    and test class (:func:`~dmlbench.data.splits.cap_images_per_class`): a short configuration's
    cheaper evaluation, the same classes for every run."""
    settings = training_settings(run)
    frame = read_manifest(manifest_path)
    frame = carve_validation(frame, settings.val_fraction, seed=split_seed(settings.val_split_seed, run["seed"]))
    train_rows = select_splits(frame, ["train"])
    if train_rows.empty:
        raise ManifestError(f"{manifest_path}: no 'train' rows")
    val_rows = cap_images_per_class(select_splits(frame, ["val"]), settings.eval_images_per_class)
    test_rows = evaluation_rows(frame, settings.eval_images_per_class)
    if test_rows.empty:
        raise ManifestError(f"{manifest_path}: no 'test' (or 'query'/'gallery') rows")
    return build_run_data(train_rows, val_rows, test_rows, settings, frame["path"].tolist())


def build_run_data(
    train_rows: pd.DataFrame,
    val_rows: pd.DataFrame,
    test_rows: pd.DataFrame,
    settings: TrainingSettings,
    store_paths: list[str],
) -> RunData:
    """The datasets of a run from its rows (manifest rows with absolute ``path``; ``val_rows`` may be empty),
    for ``training.pipeline``. Only the rows' images are read, and with ``decoded_uint8`` those of
    ``store_paths``, the files of its image store (a superset of the rows' paths; a store is keyed by its
    list of files)."""
    train_labels, classes = contiguous_labels(train_rows["label"].to_numpy())
    image = settings.image
    store = (
        open_store(store_paths, image.resize, workers=settings.num_workers)
        if settings.pipeline == "decoded_uint8"
        else None
    )

    def dataset(rows: pd.DataFrame, labels: np.ndarray, train: bool, read_every_epoch: bool = True) -> ImageSet:
        if store is not None:
            return StoredImageDataset(store, rows["path"].tolist(), labels, image, train)
        transform = training_transform(image) if train else eval_transform(image.resize, image.test_crop)
        return ImageDataset(rows["path"].tolist(), labels, transform, settings.cache_images and read_every_epoch)

    return RunData(
        train=dataset(train_rows, train_labels, train=True),
        num_classes=len(classes),
        val=None if val_rows.empty else dataset(val_rows, val_rows["label"].to_numpy(), train=False),
        test=dataset(test_rows, test_rows["label"].to_numpy(), train=False, read_every_epoch=False),
        test_split=test_rows["split"].to_numpy(),
        train_classes=np.asarray(classes),
        train_boxes=manifest_boxes(train_rows),
        val_boxes=None if val_rows.empty else manifest_boxes(val_rows),
    )
