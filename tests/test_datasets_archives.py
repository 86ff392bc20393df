"""Safe extraction: crafted tar/zip members that would escape the destination are refused."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from dmlbench.data.archives import UnsafeArchiveError, extract_archive, is_archive


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz" if path.name.endswith("gz") else "w") as tf:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tf.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tf.addfile(info, io.BytesIO(member[1]))
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_extracts_tgz_and_zip(tmp_path):
    tgz = _tar(tmp_path / "a.tgz", [("root/x.txt", b"x"), ("root/sub/y.txt", b"y"), _link("root/l", "sub/y.txt")])
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as zf:
        zf.writestr("zroot/z.txt", "z")
    assert extract_archive(tgz, tmp_path / "out") == [tmp_path / "out" / "root"]
    assert extract_archive(tmp_path / "b.zip", tmp_path / "out") == [tmp_path / "out" / "zroot"]
    assert (tmp_path / "out/root/sub/y.txt").read_text() == "y"
    assert (tmp_path / "out/root/l").read_text() == "y"
    assert (tmp_path / "out/zroot/z.txt").read_text() == "z"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["root", "zroot"]


def test_reextraction_replaces_top_level_entries_only(tmp_path):
    tgz = _tar(tmp_path / "a.tgz", [("root/x.txt", b"new")])
    (tmp_path / "out/root").mkdir(parents=True)
    (tmp_path / "out/root/stale.txt").write_text("old")
    (tmp_path / "out/other.txt").write_text("keep")
    extract_archive(tgz, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out/root").iterdir()) == ["x.txt"]
    assert (tmp_path / "out/other.txt").read_text() == "keep"


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../evil", b"x"), "'..' component"),
        (("root/../../evil", b"x"), "'..' component"),
        (("/etc/evil", b"x"), "absolute path"),
        (_link("root/link", "/etc/passwd"), "symlink to absolute path"),
        (_link("root/link", "../../outside"), "symlink pointing outside"),
        (_link("root/hard", "../outside", tarfile.LNKTYPE), "hard link pointing outside"),
        (_link("root/dev", "", tarfile.CHRTYPE), "device or FIFO"),
    ],
)
def test_crafted_tar_is_refused_before_anything_is_written(tmp_path, member, why):
    tgz = _tar(tmp_path / "evil.tar.gz", [("root/ok.txt", b"ok"), member])
    with pytest.raises(UnsafeArchiveError) as err:
        extract_archive(tgz, tmp_path / "out" / "dest")
    assert "evil.tar.gz" in str(err.value) and why in str(err.value) and "path traversal" in str(err.value)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("name", ["../evil.txt", "/abs/evil.txt", "a/../../evil.txt", "..\\evil.txt"])
def test_crafted_zip_is_refused(tmp_path, name):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("ok.txt", "ok")
        zf.writestr(zipfile.ZipInfo(name), "evil")
    with pytest.raises(UnsafeArchiveError, match=r"evil.zip: refusing to extract member"):
        extract_archive(tmp_path / "evil.zip", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_is_archive_by_name():
    assert is_archive("CUB_200_2011.tgz") and is_archive("X.ZIP") and is_archive("a.tar.xz")
    assert not is_archive("cars_annos.mat")
