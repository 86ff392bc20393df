"""A short configuration's evaluation subset (``training.eval_images_per_class``): the first N images
of each validation and test class, the same rows for every run and every reader of the test rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_run

from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.data.splits import cap_images_per_class
from dmlbench.report.figures.retrieval_grid import manifest_test_rows
from dmlbench.training.data import load_run_data


def test_the_cap_keeps_each_class_first_rows_in_file_order() -> None:
    rows = pd.DataFrame({"label": [5, 3, 5, 5, 3, 3, 7], "path": list("abcdefg")})
    assert cap_images_per_class(rows, 2)["path"].tolist() == ["a", "b", "c", "e", "g"]
    assert cap_images_per_class(rows, 3)["path"].tolist() == list("abcdefg")
    with pytest.raises(ManifestError, match="eval_images_per_class must be at least 2"):
        cap_images_per_class(rows, 1)


def test_a_run_validates_and_tests_on_the_capped_rows_of_the_same_classes(params: dict, tiny_manifest: Path) -> None:
    """12 classes × 6 images: 6 test classes; 2 of the 6 training classes are validation classes."""
    run = tiny_run(params)
    full = load_run_data(run, tiny_manifest)
    run["training"]["eval_images_per_class"] = 4
    capped = load_run_data(run, tiny_manifest)
    for name in ("val", "test"):
        before, after = getattr(full, name).labels, getattr(capped, name).labels
        assert len(before) == 6 * len(np.unique(before)) and set(after) == set(before)
        assert np.bincount(after).max() == 4 and len(after) == 4 * len(np.unique(after))
    assert np.array_equal(capped.train.labels, full.train.labels)  # training images are not capped
    rows = manifest_test_rows(tiny_manifest, capped.test.labels, 4)
    assert rows["path"].tolist() == capped.test.paths
    with pytest.raises(ValueError, match="do not match"):
        manifest_test_rows(tiny_manifest, full.test.labels, 4)
    assert len(read_manifest(tiny_manifest)) == 72  # the manifest itself is untouched
