"""The class-disjoint validation split carved from the training classes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dmlbench.data.manifest import ManifestError


def carve_validation(frame: pd.DataFrame, fraction: float, seed: int) -> pd.DataFrame:
    """Move a random ``fraction`` of the *training classes* (all their images) to ``split='val'``.

    The classes are drawn with ``numpy.random.default_rng(seed)``, independently of
    the training seed, so every method and seed of a benchmark shares the same
    validation classes unless the split seed is changed on purpose (DIABLO's
    protocol draws several).

    Args:
        frame: manifest with a ``train`` split.
        fraction: share of training classes for validation, in [0, 1). 0 keeps no validation split.
        seed: split seed.

    Returns:
        A copy of ``frame`` with the chosen classes' rows relabelled ``val``.

    >>> m = pd.DataFrame({"path": list("abcdefgh"), "label": [0, 0, 1, 1, 2, 2, 3, 3],
    ...                   "class_name": list("wwxxyyzz"), "split": ["train"] * 8})
    >>> sorted(carve_validation(m, 0.5, seed=0).groupby("split")["label"].nunique().items())
    [('train', 2), ('val', 2)]
    """
    if not 0.0 <= fraction < 1.0:
        raise ManifestError(f"training.val_fraction must be in [0, 1), got {fraction}")
    out = frame.copy()
    train_classes = np.unique(out.loc[out["split"] == "train", "label"].to_numpy())
    if "val" in set(out["split"]):
        raise ManifestError("the manifest already has a 'val' split; set training.val_fraction: 0 to use it as is")
    n_val = int(round(fraction * len(train_classes)))
    if fraction > 0 and (n_val < 2 or n_val > len(train_classes) - 2):
        raise ManifestError(
            f"training.val_fraction={fraction} of {len(train_classes)} training classes gives {n_val} "
            "validation classes; need at least 2 for validation and 2 for training"
        )
    val_classes = np.random.default_rng(seed).choice(train_classes, size=n_val, replace=False)
    out.loc[(out["split"] == "train") & out["label"].isin(val_classes), "split"] = "val"
    return out


def cap_images_per_class(rows: pd.DataFrame, per_class: int | None) -> pd.DataFrame:
    """The first ``per_class`` rows of each label, in file order (None: every row).

    A short configuration evaluates on fewer images per class with the same classes: every method
    and seed sees the same rows, so paired comparisons stay paired.

    >>> r = pd.DataFrame({"label": [0, 1, 0, 0, 1]})
    >>> cap_images_per_class(r, 2).index.tolist(), len(cap_images_per_class(r, None))
    ([0, 1, 2, 4], 5)
    """
    if per_class is None:
        return rows
    if per_class < 2:
        raise ManifestError(
            f"training.eval_images_per_class must be at least 2 (a query needs a same-class neighbour), got {per_class}"
        )
    return rows[rows.groupby("label", sort=False).cumcount() < per_class]
