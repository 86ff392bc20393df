"""Stanford Online Products on a miniature fake."""

from __future__ import annotations

import pytest
from datasets_fakes import make_sop

from dmlbench.data import sop
from dmlbench.data.manifest import ManifestError, read_manifest


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
