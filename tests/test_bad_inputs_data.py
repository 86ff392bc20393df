"""Degenerate but well-formed data (issue 28, "Wrong results accepted silently"): identical embeddings, class ids
beyond int64, an archive or an ``.npz`` that holds a member twice. Each used to give a number or a silently
chosen copy; each is now an error naming the file (and the row, line or member) and the fix, and leaves no
output. Near misses (near-identical but distinct embeddings, large in-range labels, a folder listed twice in a
tar) still work."""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from dmlbench.cli import main
from dmlbench.data.archives import UnsafeArchiveError, extract_archive
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.evaluation import evaluate_file
from dmlbench.evaluation.files import EmbeddingsFileError
from dmlbench.evaluation.validation import CollapsedEmbeddingsError
from dmlbench.report.collect import ReportInputError, read_per_query

LABELS = np.repeat(np.arange(4), 5)  # 20 rows, 4 classes


def _evaluate(tmp_path: Path, capsys, **arrays: np.ndarray) -> tuple[int, str, Path]:
    """``dmlbench evaluate`` of an .npz holding ``arrays``: exit code, stderr, and the metrics path."""
    path = tmp_path / "embeddings.npz"
    np.savez(path, **arrays)
    out = tmp_path / "metrics.json"
    code = main(["evaluate", str(path), "--out", str(out), "--recall-ks", "1,2"])
    return code, capsys.readouterr().err, out


# -------------------------------------------------------------------- identical embeddings
@pytest.mark.parametrize(
    ("embeddings", "what"),
    [
        (np.zeros((20, 8), np.float32), "all 20 embeddings are identical (all zero)"),
        (np.full((20, 8), 0.25, np.float32), "all 20 embeddings are identical (one and the same vector)"),
        (np.tile(np.float32([3.0, -1.0, 0.5]), (20, 1)), "all 20 embeddings are identical (one and the same vector)"),
    ],
)
def test_identical_embeddings_are_a_collapse_not_a_recall(tmp_path: Path, capsys, embeddings: np.ndarray, what: str):
    """They used to score R@1 = 0.25 here, the share of the class that row order put first."""
    code, err, out = _evaluate(tmp_path, capsys, embeddings=embeddings, labels=LABELS)
    assert code == 2 and f"{tmp_path / 'embeddings.npz'}: {what}: the model collapsed to one point" in err
    assert not out.exists() and not (tmp_path / "per_query.npz").exists()


def test_an_identical_gallery_is_a_collapse(tmp_path: Path):
    """Query/gallery: distinct queries against one repeated gallery vector tie on every neighbour."""
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(20, 4)).astype(np.float32)
    split = np.array(["query", "gallery"] * 10)
    embeddings[split == "gallery"] = 1.0
    path = tmp_path / "embeddings.npz"
    np.savez(path, embeddings=embeddings, labels=LABELS, split=split)
    with pytest.raises(
        CollapsedEmbeddingsError,
        match=rf"{re.escape(str(path))}: all 10 gallery embeddings are "
        r"identical",
    ):
        evaluate_file(path, tmp_path / "metrics.json", [1])


def test_near_identical_but_distinct_embeddings_are_evaluated(tmp_path: Path, capsys):
    """One ulp apart is still an order: the rows are ranked, not tied."""
    embeddings = np.ones((20, 8), np.float32)
    embeddings[:, 0] += np.arange(20, dtype=np.float32) * np.finfo(np.float32).eps
    code, _, out = _evaluate(tmp_path, capsys, embeddings=embeddings, labels=LABELS)
    assert code == 0 and out.exists()


# -------------------------------------------------------------------- labels beyond int64
def _manifest(tmp_path: Path, labels: list[str]) -> Path:
    rows = "".join(f"img{i}.png,{label},c{i},train\n" for i, label in enumerate(labels))
    path = tmp_path / "manifest.csv"
    path.write_text("path,label,class_name,split\n" + rows)
    return path


@pytest.mark.parametrize(
    ("labels", "line", "shown"),
    [
        (["1", "99999999999999999999"], 3, "99999999999999999999"),
        (["-99999999999999999999", "1"], 2, "-99999999999999999999"),
        (["1", "9223372036854775808"], 3, "9223372036854775808"),  # int64's largest + 1: pandas reads it as uint64
        (["7", "1e30"], 3, "1e30"),
    ],
)
def test_a_manifest_label_beyond_int64_names_the_file_and_line(
    tmp_path: Path, labels: list[str], line: int, shown: str
):
    """These used to wrap to -2^63 (two such classes merged into one) or to a negative id."""
    path = _manifest(tmp_path, labels)
    with pytest.raises(
        ManifestError,
        match=rf"{re.escape(str(path))}: column 'label' holds {shown} on line\(s\) "
        rf"{line}, outside the 64-bit range of class ids.*number the classes",
    ):
        read_manifest(path)


def test_labels_are_read_exactly_not_through_a_float(tmp_path: Path):
    """A fraction-looking cell ("1.0") made pandas read the column as floats, merging 2^53 + 1 into 2^53."""
    path = _manifest(tmp_path, ["9007199254740993", "9007199254740992", "1.0", "9223372036854775807"])
    assert read_manifest(path)["label"].tolist() == [2**53 + 1, 2**53, 1, 2**63 - 1]


@pytest.mark.parametrize("big", [2**63, 2**64 - 1])
def test_an_embeddings_label_beyond_int64_names_the_file_and_row(tmp_path: Path, capsys, big: int):
    labels = LABELS.astype(np.uint64)
    labels[7] = big
    embeddings = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    code, err, out = _evaluate(tmp_path, capsys, embeddings=embeddings, labels=labels)
    assert code == 2 and f"{tmp_path / 'embeddings.npz'}: labels row 7 holds {big}, beyond 9223372036854775807" in err
    assert not out.exists()


# -------------------------------------------------------------------- a member twice
def _npy(array: np.ndarray) -> bytes:
    blob = io.BytesIO()
    np.save(blob, array)
    return blob.getvalue()


def _zip_with(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A zip of ``members`` in this order, a name repeated as given (zipfile warns, and writes it)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members:
            with pytest.warns(UserWarning, match="Duplicate name") if name in zf.namelist() else nullcontext():
                zf.writestr(name, data)
    return path


def test_an_embeddings_npz_with_an_array_twice_names_the_array(tmp_path: Path):
    """numpy's NpzFile lists both and reads the last written: the first 'embeddings' was ignored silently."""
    path = _zip_with(
        tmp_path / "embeddings.npz",
        [
            ("embeddings.npy", _npy(np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32))),
            ("labels.npy", _npy(LABELS)),
            ("embeddings.npy", _npy(np.random.default_rng(1).normal(size=(20, 4)).astype(np.float32))),
        ],
    )
    with pytest.raises(
        EmbeddingsFileError,
        match=rf"{re.escape(str(path))}: holds the array 'embeddings' more than "
        r"once.*Re-create the file",
    ):
        evaluate_file(path, tmp_path / "metrics.json", [1])
    assert not (tmp_path / "metrics.json").exists()


def test_a_per_query_npz_with_an_array_twice_names_the_array(tmp_path: Path):
    run = tmp_path / "results" / "runs" / "synthetic" / "triplet" / "seed0"
    run.mkdir(parents=True)
    path = _zip_with(run / "per_query.npz", [("row.npy", _npy(np.arange(3))), ("row.npy", _npy(np.arange(4)))])
    with pytest.raises(ReportInputError, match=r"holds the array 'row' more than once.*rerun the run's evaluate"):
        read_per_query(path)


def _tar_with(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    """A tar of files (bytes) and folders (None), in this order."""
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("build", "member"),
    [
        (lambda tmp: _tar_with(tmp / "data.tar", [("root/a.txt", b"first"), ("root/a.txt", b"second")]), "root/a.txt"),
        (
            lambda tmp: _tar_with(tmp / "data.tar", [("root/a.txt", b"first"), ("./root//a.txt", b"second")]),
            "./root//a.txt",
        ),
        (lambda tmp: _zip_with(tmp / "data.zip", [("root/a.txt", b"first"), ("root/a.txt", b"second")]), "root/a.txt"),
    ],
)
def test_an_archive_with_a_member_twice_names_it_and_extracts_nothing(tmp_path: Path, build, member: str):
    """Extraction used to keep the last copy silently, so the dataset depended on the member order."""
    archive = build(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(
        UnsafeArchiveError,
        match=rf"{re.escape(str(archive))}: member '{re.escape(member)}' appears "
        r"more than once.*download it again",
    ):
        extract_archive(archive, out)
    assert not out.exists() or not list(out.iterdir())


def test_a_folder_listed_twice_in_a_tar_is_extracted(tmp_path: Path):
    archive = _tar_with(tmp_path / "data.tar", [("root", None), ("root/a.txt", b"x"), ("root", None)])
    extract_archive(archive, tmp_path / "out")
    assert (tmp_path / "out" / "root" / "a.txt").read_bytes() == b"x"
