"""Safe extraction of tar (plain, gz, bz2, xz) and zip archives.

Every member is checked before anything is written: absolute paths, ``..``
components, links whose target leaves the destination, device/FIFO members
(path traversal, "zip slip") and a file path that two members write are
refused with :class:`UnsafeArchiveError` naming the archive and the member.
Tar members are then extracted with Python's ``data`` filter as a second line
of defence. Extraction goes to a temporary folder inside the destination whose
top-level entries are then renamed into place, so an interrupted extraction
leaves no half-written tree under its final name.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from dmlbench.errors import DmlbenchError

ARCHIVE_SUFFIXES: tuple[str, ...] = (".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")


class UnsafeArchiveError(DmlbenchError, ValueError):
    """An archive member would be written outside the destination folder, or over another member."""


def is_archive(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` has one of :data:`ARCHIVE_SUFFIXES` (by name, case-insensitive)."""
    return str(path).lower().endswith(ARCHIVE_SUFFIXES)


def _escapes(name: str) -> str | None:
    """Why a member path (or link target) would leave the destination, or None."""
    name = name.replace("\\", "/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name).parts:
        return "'..' component"
    return None


def _check_tar_member(member: tarfile.TarInfo) -> str | None:
    """Why a tar member is unsafe, or None."""
    why = _escapes(member.name)
    if why:
        return why
    if member.issym():
        if _escapes(member.linkname) == "absolute path":
            return f"symlink to absolute path {member.linkname!r}"
        target = os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname))
        if target == ".." or target.startswith("../") or _escapes(target):
            return f"symlink pointing outside ({member.linkname!r})"
    if member.islnk() and _escapes(os.path.normpath(member.linkname)):
        return f"hard link pointing outside ({member.linkname!r})"
    if member.isdev():
        return "device or FIFO member"
    return None


class DamagedArchiveError(DmlbenchError, ValueError):
    """An archive cannot be read (not the format its name says, truncated, corrupt)."""


#: What the tar, gzip/bz2/xz and zip readers raise on a damaged or foreign file.
READ_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    OSError,
)


@contextmanager
def _reading(archive: Path) -> Iterator[None]:
    """Turn the readers' errors into a :class:`DamagedArchiveError` that names ``archive``."""
    try:
        yield
    except UnsafeArchiveError:
        raise
    except READ_ERRORS as err:
        raise DamagedArchiveError(
            f"{archive}: not a readable {'zip' if archive.name.lower().endswith('.zip') else 'tar'} archive "
            f"({type(err).__name__}: {err}); it is truncated or not the file it is named after: delete it "
            f"and fetch it again"
        ) from err


def check_archive(archive: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafeArchiveError` for the first unsafe or repeated member of ``archive``
    (:class:`DamagedArchiveError` when it cannot be read)."""
    archive = Path(archive)
    with _reading(archive):
        _check_members(archive)


def _check_members(archive: Path) -> None:
    if archive.name.lower().endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            problems = ((info.filename, _escapes(info.filename)) for info in zf.infolist())
            _raise_first(archive, problems)
            _refuse_repeated(archive, [info.filename for info in zf.infolist() if not info.is_dir()])
    else:
        with tarfile.open(archive, "r:*") as tf:
            _raise_first(archive, ((m.name, _check_tar_member(m)) for m in tf.getmembers()))
            _refuse_repeated(archive, [m.name for m in tf.getmembers() if not m.isdir()])


def _refuse_repeated(archive: Path, names: list[str]) -> None:
    """Refuse a file (or link) path that two members of ``archive`` write: the later would silently replace
    the earlier, so which content a dataset gets would depend on member order. Paths are compared as written
    to disk (``a//b``, ``./a/b`` and ``a/b`` are one file)."""
    seen: set[str] = set()
    for name in names:
        path = str(PurePosixPath(name.replace("\\", "/")))
        if path in seen:
            raise UnsafeArchiveError(
                f"{archive}: member {name!r} appears more than once; extracting would keep only the last copy. "
                f"The archive is damaged or not the official one; delete it and download it again."
            )
        seen.add(path)


def _raise_first(archive: Path, problems) -> None:
    for name, why in problems:
        if why:
            raise UnsafeArchiveError(
                f"{archive}: refusing to extract member {name!r}: {why} (path traversal). "
                f"The archive is damaged or malicious; delete it and download it again."
            )


def extract_archive(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> list[Path]:
    """Check, then extract ``archive`` into ``dest``.

    Top-level entries of the archive replace same-named entries in ``dest``
    (a re-run after an interrupted extraction); nothing else in ``dest`` is
    touched.

    Returns:
        The top-level paths created in ``dest``.
    """
    archive, dest = Path(archive), Path(dest)
    check_archive(archive)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".extract-{archive.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with _reading(archive):
            if archive.name.lower().endswith(".zip"):
                with zipfile.ZipFile(archive) as zf:
                    zf.extractall(tmp)
            else:
                with tarfile.open(archive, "r:*") as tf:
                    tf.extractall(tmp, filter="data")
        created = []
        for entry in sorted(tmp.iterdir()):
            target = dest / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(entry, target)
            created.append(target)
        return created
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
