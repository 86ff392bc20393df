"""Fetching the official dataset archives: mirrors, resume, checksums.

:func:`fetch` downloads one file: it tries the official URL and then the
known mirrors in order, resumes an interrupted download (an HTTP ``Range``
request continuing ``<dest>.part``), verifies the checksum and renames the
part file to ``dest`` only when it matches. :func:`download` does this for
every archive of a dataset (each dataset module lists its ``ARCHIVES``),
extracts them safely and returns the dataset root.

Checksums: a pinned ``sha256`` is authoritative. Where only the ``md5`` that
the community has used for years is known, it verifies the file instead and
the sha256 is printed so that it can be pinned. Where neither is known the
sha256 is printed and the file is refused unless ``allow_unverified=True``
(``dmlbench download --allow-unverified``); the part file is kept, so the
re-run does not download it again.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from dmlbench.data.archives import extract_archive, is_archive

USER_AGENT = "dmlbench-downloader/0.1 (+https://pypi.org/project/dmlbench)"
CHUNK_BYTES = 1 << 20


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


class DownloadError(RuntimeError):
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
        with open(part, "ab" if offset else "wb") as out, tqdm(
            total=total, initial=offset, unit="B", unit_scale=True, desc=part.name, disable=None, file=sys.stderr
        ) as bar:
            for block in iter(lambda: response.read(CHUNK_BYTES), b""):
                out.write(block)
                written += len(block)
                bar.update(len(block))
    if total is not None and written < total:
        raise DownloadError(f"connection closed after {written} of {total} bytes (kept {part.name}; re-run to resume)")


def _verify(path: Path, sha256: str | None, md5: str | None, allow_unverified: bool) -> str | None:
    """None when ``path`` is acceptable, else why not (a mismatch names expected and found)."""
    found = file_digest(path, "sha256")
    if sha256 is not None:
        return None if found == sha256.lower() else f"sha256 mismatch: expected {sha256.lower()}, found {found}"
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
        sha256: pinned digest, or None (see the module docstring).
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


def download(kind: str, raw_dir: str | os.PathLike[str], *, allow_unverified: bool = False) -> Path:
    """Fetch and extract every archive of dataset ``kind`` under ``raw_dir/<kind>/``.

    Each archive is fetched (:func:`fetch`), extracted (tar/zip, safely) or,
    for plain files, kept where it lands; a ``.<file>.done`` marker makes a
    re-run skip it, so the downloaded archives may be deleted afterwards.

    Returns:
        The dataset root to give to ``prepare`` (``root:`` or ``DMLBENCH_<KIND>_ROOT``).

    Raises:
        DownloadError: the dataset is distributed by request / Google Drive
            only, or no URL worked; the message says how to get it by hand.
    """
    from dmlbench.data.registry import PREPARER_MODULES

    if kind not in PREPARER_MODULES:
        raise DownloadError(f"unknown dataset kind {kind!r}; known: {sorted(PREPARER_MODULES)}")
    module = importlib.import_module(PREPARER_MODULES[kind])
    if not hasattr(module, "ARCHIVES"):
        raise DownloadError(f"dataset kind {kind!r} has nothing to download (`dmlbench prepare` generates it)")
    info, archives = module.INFO, module.ARCHIVES
    by_hand = (
        f"Get it by hand from {info.homepage}, extract it, and point dmlbench at the folder "
        f"{info.root_name}: set {info.env_var}=/path/to/{info.root_name} or `root:` in its params section. "
        f"{info.manual}"
    ).strip()
    if not archives:
        raise DownloadError(f"{info.title} cannot be downloaded automatically. {by_hand}")
    target = Path(raw_dir) / kind
    for archive in archives:
        marker = target / f".{archive.filename}.done"
        if marker.exists():
            continue
        try:
            path = fetch(archive.urls, archive.sha256, target / archive.filename, md5=archive.md5,
                         allow_unverified=allow_unverified)
        except UnverifiedDownloadError:
            raise
        except DownloadError as err:
            raise DownloadError(f"{info.title}: {err}\n{by_hand}") from err
        if is_archive(path):
            extract_archive(path, target)
        marker.touch()
    return target / module.ARCHIVE_ROOT
