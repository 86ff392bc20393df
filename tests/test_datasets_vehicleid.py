"""PKU VehicleID on a miniature fake: test-size selection."""

from __future__ import annotations

import pytest
from datasets_fakes import VEHICLEID_TEST, make_vehicleid, vehicleid_counts

from dmlbench.data import vehicleid
from dmlbench.data.manifest import read_manifest


@pytest.fixture
def fake(tmp_path):
    return make_vehicleid(tmp_path / "raw")


@pytest.mark.parametrize("test_size", ["small", "medium", "large"])
def test_test_size_selects_the_test_list(fake, tmp_path, test_size):
    config = {**fake.config("vehicleid", test_size=test_size), "expected_counts": vehicleid_counts(test_size)}
    frame = read_manifest(vehicleid.prepare(config, tmp_path / "out"))
    assert set(frame.loc[frame["split"] == "test", "label"]) == set(VEHICLEID_TEST[test_size])
    assert set(frame.loc[frame["split"] == "train", "label"]) == {1, 2, 3, 4}
    assert frame.loc[0, "path"] == str(fake.root / "image/0000100.jpg")


def test_default_test_size_is_small(fake, tmp_path):
    frame = read_manifest(vehicleid.prepare(fake.config("vehicleid"), tmp_path / "out"))
    assert frame.loc[frame["split"] == "test", "label"].nunique() == len(VEHICLEID_TEST["small"])


def test_pinned_counts_follow_test_size():
    assert {size: c["test"][1] for size, c in vehicleid.EXPECTED_COUNTS.items()} == vehicleid.TEST_SIZES


def test_bad_test_size(fake, tmp_path):
    with pytest.raises(ValueError, match=r"test_size must be one of \['small', 'medium', 'large'\], got 'huge'"):
        vehicleid.prepare(fake.config("vehicleid", test_size="huge"), tmp_path / "out")


def test_wrong_counts_name_the_selected_test_list(fake, tmp_path):
    config = fake.config("vehicleid", test_size="large")  # small-list counts: mismatch on test
    with pytest.raises(ValueError, match=r"test_list_2400.txt.*split 'test' has 12 images / 4 classes, expected 6 / 2"):
        vehicleid.prepare(config, tmp_path / "out")
