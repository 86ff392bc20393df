"""Fetching the official dataset archives: mirrors, resume, checksums.

:func:`fetch` downloads one file: it tries the official URL and then the
known mirrors in order, resumes an interrupted download (an HTTP ``Range``
request continuing ``<dest>.part``), verifies the checksum and renames the
part file to ``dest`` only when it matches.

A dataset's files live under ``<raw_dir>/<kind>/`` (each dataset module lists
its ``ARCHIVES``):

- :func:`fetch_archive` downloads one of them to ``<raw_dir>/<kind>/<filename>``
  (the ``download`` rule of the workflow runs it once per archive, so the
  archives are Snakemake / DVC outputs);
- :func:`extract_archives` extracts the archives found there, safely, into the
  extraction cache ``<raw_dir>/<kind>/extracted/`` and returns the dataset
  root inside it (``prepare`` calls it for ``download: true``);
- :func:`download` is both, for every archive (``dmlbench download <kind>``).

The extraction cache is not a workflow output: it is rebuilt from the
archives when missing, and an archive whose sha256 differs from the one
recorded at its extraction is extracted again.

Checksums: a pinned ``sha256`` is authoritative; it may be a prefix of at
least 8 hex digits, as in torch hub file names (``resnet50-0676ba61.pth``).
Where only the ``md5`` that the community has used for years is known, it
verifies the file instead and the sha256 is printed so that it can be pinned.
Where neither is known the sha256 is printed and the file is refused unless
``allow_unverified=True`` (``dmlbench download --allow-unverified``); the part
file is kept, so the re-run does not download it again.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

from tqdm import tqdm

from dmlbench.atomic import exclusive_lock
from dmlbench.data.archives import extract_archive, is_archive
from dmlbench.data.kinds import PREPARER_MODULES
from dmlbench.errors import DmlbenchError

USER_AGENT = "dmlbench-downloader/0.1 (+https://pypi.org/project/dmlbench)"
CHUNK_BYTES = 1 << 20
#: Folder of ``<raw_dir>/<kind>/`` that holds the extracted archives.
EXTRACTED_DIR = "extracted"


class Archive(NamedTuple):
    """One file of an official release.

    Attributes:
        filename: name to save it under (and to extract, when it is an archive).
        sha256: pinned hex digest, or None when not known for sure.
        urls: official URL first, then mirrors, tried in order.
        md5: hex digest used when ``sha256`` is None (legacy pins), or None.
    """

    filename: str
    sha256: str | None
    urls: Sequence[str]
    md5: str | None = None


class DownloadError(DmlbenchError, RuntimeError):
    """A file could not be fetched from any of its URLs, or a dataset cannot be downloaded."""


class UnverifiedDownloadError(DownloadError):
    """A file was fetched but no checksum is known to verify it."""


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _describe(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return f"{type(err.reason).__name__}: {err.reason}"
    return f"{type(err).__name__}: {err}"


def _download(url: str, part: Path, timeout: float) -> None:
    """Append the rest of ``url`` to ``part`` (Range request when it has bytes), or start over.

    Raises:
        DownloadError: the connection ended before ``Content-Length`` bytes
            (the part file is kept for the next attempt); urllib/OSError on
            connection failures.
    """
    offset = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    resumable = url.lower().startswith(("http://", "https://"))
    if offset and resumable:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left to send: the part file is complete
            return
        raise
    with response:
        status = getattr(response, "status", None)
        if status != 206:  # a full body: the server ignored the range (or it is FTP)
            offset = 0
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        written = offset
        with (
            open(part, "ab" if offset else "wb") as out,
            tqdm(
                total=total, initial=offset, unit="B", unit_scale=True, desc=part.name, disable=None, file=sys.stderr
            ) as bar,
        ):
            for block in iter(lambda: response.read(CHUNK_BYTES), b""):
                out.write(block)
                written += len(block)
                bar.update(len(block))
    if total is not None and written < total:
        raise DownloadError(f"connection closed after {written} of {total} bytes (kept {part.name}; re-run to resume)")


def _verify(
    path: Path, sha256: str | None, md5: str | None, allow_unverified: bool, found: str | None = None
) -> str | None:
    """None when ``path`` is acceptable, else why not (a mismatch names expected and found).

    ``found``: the file's sha256 when the caller has already computed it (not hashed again).
    """
    found = found or file_digest(path, "sha256")
    if sha256 is not None:
        if len(sha256) < 8:
            raise ValueError(f"a pinned sha256 needs at least 8 hex digits, got {sha256!r}")
        return (
            None if found.startswith(sha256.lower()) else f"sha256 mismatch: expected {sha256.lower()}, found {found}"
        )
    print(f"{path.name}: sha256 {found} (not pinned in dmlbench)", file=sys.stderr)
    if md5 is not None:
        found_md5 = file_digest(path, "md5")
        return None if found_md5 == md5.lower() else f"md5 mismatch: expected {md5.lower()}, found {found_md5}"
    if allow_unverified:
        return None
    raise UnverifiedDownloadError(
        f"{path}: no checksum is known for {path.name}; computed sha256 {found}. Check it against a "
        f"trusted source, then re-run with allow_unverified=True (`dmlbench download --allow-unverified`) "
        f"to accept it; the file is kept, so nothing is downloaded again."
    )


def fetch(
    urls: Sequence[str],
    sha256: str | None,
    dest: str | os.PathLike[str],
    *,
    md5: str | None = None,
    allow_unverified: bool = False,
    timeout: float = 60.0,
) -> Path:
    """Download ``dest`` from the first of ``urls`` that yields a verified file.

    The bytes go to ``<dest>.part``; a part file left by an earlier attempt is
    continued with an HTTP Range request. On a checksum mismatch the part file
    is deleted and the next URL is tried from scratch. On success the part
    file is renamed to ``dest`` (atomic). An existing ``dest`` is verified and
    returned without downloading.

    Args:
        urls: official URL first, then mirrors.
        sha256: pinned digest (or its first ≥ 8 hex digits), or None (see the module docstring).
        md5: legacy digest used when ``sha256`` is None.
        allow_unverified: accept a file that no checksum can verify.
        timeout: seconds without data before a connection counts as failed.

    Raises:
        DownloadError: listing every URL tried and why it failed.
        UnverifiedDownloadError: no checksum known and ``allow_unverified`` is False.
    """
    dest = Path(dest)
    if dest.exists():
        problem = _verify(dest, sha256, md5, allow_unverified)
        if problem:
            raise DownloadError(f"{dest} exists but does not verify ({problem}); delete it and re-run")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    failures = []
    for url in urls:
        try:
            _download(url, part, timeout)
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError, DownloadError) as err:
            failures.append(f"  {url}: {_describe(err)}")
            continue
        problem = _verify(part, sha256, md5, allow_unverified)
        if problem:
            part.unlink()
            failures.append(f"  {url}: {problem} (deleted {part.name})")
            continue
        os.replace(part, dest)
        return dest
    raise DownloadError(f"could not fetch {dest.name}; tried {len(failures)} URL(s):\n" + "\n".join(failures))


def _dataset_module(kind: str) -> ModuleType:
    """The preparer module of ``kind``, which lists ``INFO``, ``ARCHIVES`` and ``ARCHIVE_ROOT``.

    Raises:
        DownloadError: unknown kind, a generated dataset (nothing to download),
            or a dataset distributed by request only (the message says how to
            get it by hand).
    """
    module = PREPARER_MODULES.lookup(kind, error=DownloadError)
    if not hasattr(module, "ARCHIVES"):
        raise DownloadError(f"dataset kind {kind!r} has nothing to download (`dmlbench prepare` generates it)")
    if not module.ARCHIVES:
        raise DownloadError(f"{module.INFO.title} cannot be downloaded automatically. {_by_hand(module)}")
    return module


def archive_filenames(kind: str) -> list[str]:
    """The file names of the official archives of dataset ``kind`` (``<raw_dir>/<kind>/<filename>``):
    none for an unknown kind, a generated one, or one distributed by request only."""
    if kind not in PREPARER_MODULES:
        return []
    return [archive.filename for archive in getattr(PREPARER_MODULES[kind], "ARCHIVES", [])]


def _by_hand(module: ModuleType) -> str:
    info = module.INFO
    return (
        f"Get it by hand from {info.homepage}, extract it, and point dmlbench at the folder "
        f"{info.root_name}: set {info.env_var}=/path/to/{info.root_name} or `root:` in its params section. "
        f"{info.manual}"
    ).strip()


def _archive(module: ModuleType, filename: str) -> Archive:
    for archive in module.ARCHIVES:
        if archive.filename == filename:
            return archive
    names = [archive.filename for archive in module.ARCHIVES]
    raise DownloadError(f"{module.INFO.title} has no archive {filename!r}; its archives: {names}")


def fetch_archive(
    kind: str,
    filename: str,
    dest: str | os.PathLike[str],
    *,
    allow_unverified: bool = False,
) -> Path:
    """Download the archive ``filename`` of dataset ``kind`` to the file ``dest`` (no extraction).

    ``dest`` is normally ``<raw_dir>/<kind>/<filename>``, where
    :func:`extract_archives` looks for it. An existing ``dest`` is verified
    and kept (see :func:`fetch`).

    Raises:
        DownloadError: unknown kind or file name, a dataset that cannot be
            downloaded, or no URL worked (the message says how to get it by hand).
        UnverifiedDownloadError: no checksum known and ``allow_unverified`` is False.
    """
    module = _dataset_module(kind)
    archive = _archive(module, filename)
    try:
        return fetch(archive.urls, archive.sha256, dest, md5=archive.md5, allow_unverified=allow_unverified)
    except UnverifiedDownloadError:
        raise
    except DownloadError as err:
        raise DownloadError(f"{module.INFO.title}: {err}\n{_by_hand(module)}") from err


def _read_marker(marker: Path) -> dict | None:
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("sha256"), str) else None


def _write_marker(marker: Path, record: dict) -> None:
    tmp = marker.with_name(marker.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, marker)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _extract_one(path: Path, cache: Path) -> list[str]:
    """Extract an archive (or copy a plain file) into ``cache``; the top-level names created.

    Everything is written under a temporary name first and renamed into place.
    """
    if is_archive(path):
        return [entry.name for entry in extract_archive(path, cache)]
    tmp = cache / f".copy-{path.name}.tmp{os.getpid()}"
    shutil.copyfile(path, tmp)
    os.replace(tmp, cache / path.name)
    return [path.name]


def extract_archives(kind: str, raw_dir: str | os.PathLike[str]) -> Path:
    """Extract the archives of dataset ``kind`` in ``raw_dir/<kind>/`` into ``raw_dir/<kind>/extracted/``.

    Idempotent: ``extracted/.<filename>.done`` records the sha256 (and size and
    mtime, to skip hashing an unchanged file) of each archive when its
    extraction completed. An archive is extracted again when its marker is
    missing or records another sha256; the top-level entries that the old
    extraction created are removed first. The marker is deleted before and
    written after an extraction, and the extraction itself goes to a
    temporary folder that is renamed into place, so an interrupted extraction
    never looks complete. An archive that was deleted after a completed
    extraction keeps its extracted files. Plain files (e.g. Cars196's
    ``cars_annos.mat``) are copied. Concurrent calls for the same kind
    serialise on a lock file.

    Returns:
        The dataset root inside the cache (``extracted/<ARCHIVE_ROOT>``), to
        give to ``prepare``.

    Raises:
        DownloadError: an archive is neither in ``raw_dir/<kind>/`` nor
            extracted, the kind cannot be downloaded, or the archives do not
            contain the expected root folder.
    """
    module = _dataset_module(kind)
    target = Path(raw_dir) / kind
    cache = target / EXTRACTED_DIR
    with exclusive_lock(target / f".{EXTRACTED_DIR}.lock"):  # two prepare jobs may extract the same kind
        cache.mkdir(parents=True, exist_ok=True)
        for stale in cache.glob(".*.tmp*"):  # left by a killed extraction
            _remove(stale)
        for archive in module.ARCHIVES:
            path, marker = target / archive.filename, cache / f".{archive.filename}.done"
            record = _read_marker(marker)
            if not path.is_file():
                if record is not None:
                    continue  # extracted earlier; the archive has been deleted since
                raise DownloadError(
                    f"{module.INFO.title}: archive {path} not found (and not extracted before). "
                    f"Fetch it with `dmlbench download {kind}` (or `dmlbench download {kind} --archive "
                    f"{archive.filename}`, or `snakemake {path}`). {_by_hand(module)}"
                )
            stat = path.stat()
            if record is not None and (record.get("size"), record.get("mtime_ns")) == (stat.st_size, stat.st_mtime_ns):
                continue
            sha256 = file_digest(path, "sha256")
            if record is not None and record["sha256"] == sha256:
                _write_marker(marker, {**record, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
                continue
            problem = _verify(path, archive.sha256, archive.md5, allow_unverified=True, found=sha256)
            if problem:
                raise DownloadError(
                    f"{path}: {problem}; it is not the archive dmlbench pins, so nothing was extracted. "
                    f"Delete it and fetch it again with `dmlbench download {kind}`. {_by_hand(module)}"
                )
            marker.unlink(missing_ok=True)
            for name in record.get("entries", []) if record else []:
                if name and "/" not in name and name not in (".", ".."):
                    _remove(cache / name)
            print(f"extracting {path} into {cache}", file=sys.stderr)
            entries = _extract_one(path, cache)
            _write_marker(
                marker,
                {
                    "archive": archive.filename,
                    "sha256": sha256,
                    "size": stat.st_size,
                    "mtime_ns": stat.st_mtime_ns,
                    "entries": entries,
                },
            )
    root = cache / module.ARCHIVE_ROOT
    if not root.is_dir():
        raise DownloadError(
            f"{module.INFO.title}: the extracted archives in {cache} hold no folder {module.ARCHIVE_ROOT!r}; "
            f"delete {cache} and the archives in {target} and fetch them again."
        )
    return root


def download(kind: str, raw_dir: str | os.PathLike[str], *, allow_unverified: bool = False) -> Path:
    """Fetch every archive of dataset ``kind`` to ``raw_dir/<kind>/`` and extract them.

    :func:`fetch_archive` for each archive, then :func:`extract_archives`.
    An archive whose extraction is complete is not fetched again, so the
    downloaded archives may be deleted afterwards.

    Returns:
        The dataset root, ``raw_dir/<kind>/extracted/<ARCHIVE_ROOT>`` (give it
        to ``prepare`` as ``root:`` or ``DMLBENCH_<KIND>_ROOT``, or set
        ``download: true`` in the dataset's params section).

    Raises:
        DownloadError: the dataset is distributed by request / Google Drive
            only, or no URL worked; the message says how to get it by hand.
    """
    module = _dataset_module(kind)
    target = Path(raw_dir) / kind
    for archive in module.ARCHIVES:
        path = target / archive.filename
        if not path.exists() and _read_marker(target / EXTRACTED_DIR / f".{archive.filename}.done"):
            continue
        fetch_archive(kind, archive.filename, path, allow_unverified=allow_unverified)
    return extract_archives(kind, raw_dir)
