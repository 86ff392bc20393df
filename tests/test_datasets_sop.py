"""Stanford Online Products on a miniature fake."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from datasets_fakes import make_sop

from dmlbench.data import sop
from dmlbench.data.images import ImageCheckError
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.methods.dnc_clustering import read_class_groups, training_class_groups


@pytest.fixture
def fake(tmp_path):
    return make_sop(tmp_path / "raw")


def test_parsing_and_split_from_the_two_list_files(fake, tmp_path):
    frame = read_manifest(sop.prepare(fake.config("sop"), tmp_path / "out"))
    assert list(frame.columns) == ["path", "label", "class_name", "split"]
    assert set(frame.loc[frame["split"] == "train", "label"]) == {1, 2, 3, 4}
    assert set(frame.loc[frame["split"] == "test", "label"]) == {5, 6, 7, 8}
    first = frame.iloc[0]
    assert first["path"] == str(fake.root / "bicycle_final/111085122801_0.JPG")
    assert first["class_name"] == "bicycle/1"


def test_class_in_both_lists_breaks_the_zero_shot_protocol(fake, tmp_path):
    test_list = fake.root / "Ebay_test.txt"
    test_list.write_text(test_list.read_text().replace(" 5 1 bicycle_final", " 1 1 bicycle_final"))
    with pytest.raises(ManifestError, match=r"1 class\(es\) appear in both train and an evaluation split"):
        sop.prepare(fake.config("sop"), tmp_path / "out")


def test_cropped_is_not_an_option(fake, tmp_path):
    with pytest.raises(ValueError, match=r"unknown params key\(s\) \['cropped'\]"):
        sop.prepare(fake.config("sop", cropped=True), tmp_path / "out")


def test_super_classes_file_gives_each_class_its_release_super_class(fake, tmp_path):
    """The fake puts odd class ids under super class 1 (bicycle), even ones under 2 (chair)."""
    sop.prepare(fake.config("sop"), tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "super_classes.csv")
    assert list(table.columns) == ["label", "group", "split"]
    assert table.to_dict("list") == {
        "label": [1, 2, 3, 4, 5, 6, 7, 8],
        "group": [1, 2, 1, 2, 1, 2, 1, 2],
        "split": ["train"] * 4 + ["test"] * 4,
    }
    groups = read_class_groups(tmp_path / "out" / "super_classes.csv", "group")
    assert training_class_groups(groups, np.array([1, 2, 3, 4])).tolist() == [0, 1, 0, 1]


def test_class_under_two_super_classes_is_an_error(fake, tmp_path):
    train_list = fake.root / "Ebay_train.txt"
    lines = train_list.read_text().splitlines()
    lines[2] = lines[2].replace(" 1 1 ", " 1 2 ", 1)  # 2nd image of class 1 under super class 2
    train_list.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"Ebay_train.txt: class 1 has super_class_id 2 and 1"):
        sop.prepare(fake.config("sop"), tmp_path / "out")


def test_failed_checks_leave_no_super_classes_file(fake, tmp_path):
    (fake.root / "bicycle_final/111085122801_0.JPG").unlink()
    with pytest.raises(ImageCheckError, match="111085122801_0.JPG: missing"):
        sop.prepare(fake.config("sop"), tmp_path / "out")
    assert not (tmp_path / "out" / "super_classes.csv").exists()
