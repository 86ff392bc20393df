"""The class-disjoint folds of the training classes, and a trial's data on one of them.

A tune job reads the manifest's ``train`` rows only (:func:`training_rows`): the test split (``test``,
``query``, ``gallery``) is dropped before any image or image store is opened, so nothing a tune job does can
depend on it. The training classes are dealt into ``k`` folds by a seeded permutation (:func:`class_folds`);
fold ``f``'s run trains on the other ``k - 1`` folds' classes and is scored on fold ``f``'s images
(:func:`fold_data`), as in the Reality Check (Musgrave et al., 2020, Sec. 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dmlbench.data.manifest import ManifestError, read_manifest, select_splits
from dmlbench.data.splits import cap_images_per_class
from dmlbench.settings import TrainingSettings
from dmlbench.training.data import RunData, build_run_data

#: the fewest classes a fold may hold: R@1 and MAP@R need another class to retrieve against.
MIN_CLASSES_PER_FOLD = 2


def class_folds(classes: Sequence[int] | np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """Deal the distinct ``classes`` into ``k`` disjoint folds that cover them: a permutation drawn with
    ``numpy.random.default_rng(seed)``, cut into ``k`` parts whose sizes differ by at most one (each sorted).

    Raises:
        ValueError: fewer than :data:`MIN_CLASSES_PER_FOLD` classes per fold.

    >>> [f.tolist() for f in class_folds([10, 11, 12, 13, 14], k=2, seed=0)]
    [[12, 13, 14], [10, 11]]
    """
    distinct = np.unique(np.asarray(classes))
    if k < 2 or len(distinct) < MIN_CLASSES_PER_FOLD * k:
        raise ValueError(
            f"tuning.folds = {k} needs k >= 2 and at least {MIN_CLASSES_PER_FOLD * k} training classes "
            f"({MIN_CLASSES_PER_FOLD} per fold); there are {len(distinct)}: use fewer folds"
        )
    permuted = np.random.default_rng(seed).permutation(distinct)
    return [np.sort(part) for part in np.array_split(permuted, k)]


def training_rows(manifest_path: str | Path) -> pd.DataFrame:
    """The manifest's ``train`` rows (absolute paths): everything a tune job may read.

    Raises:
        ManifestError: the manifest has no training rows.
    """
    rows = select_splits(read_manifest(manifest_path), ["train"])
    if rows.empty:
        raise ManifestError(f"{manifest_path}: no 'train' rows to tune on")
    return rows


def fold_data(rows: pd.DataFrame, settings: TrainingSettings, folds: Sequence[np.ndarray], held_out: int) -> RunData:
    """One fold's data: the run trains on the classes of every fold but ``held_out`` and is scored on
    ``held_out``'s images (the first ``training.eval_images_per_class`` of each class), which fill the data's
    evaluation slot (``test``, split ``test``); there is no validation split, since the run keeps its last
    epoch as the tuned run will. Only ``rows`` (training rows, :func:`training_rows`) are read.
    """
    scored = rows["label"].isin(folds[held_out])
    evaluated = cap_images_per_class(rows[scored], settings.eval_images_per_class).assign(split="test")
    return build_run_data(rows[~scored], rows.iloc[:0], evaluated, settings, rows["path"].tolist())
