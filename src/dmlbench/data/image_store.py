"""A decoded-uint8 image store: every image of a dataset decoded once, at one size, shared by every run.

Decoding a JPEG costs more CPU than everything else a loader does with it (a 500 × 375 CUB image:
~3 ms); a GPU trains on thousands of images a second, so a loader that decodes every image every
epoch needs more cores than a GPU node gives it (``benchmarks/bench_loader.py``). The store decodes
each image once, scales its shorter side to ``short_side`` px exactly as the test transform does
(:func:`stored_size`, PIL bilinear with antialiasing), and keeps the pixels as one flat uint8 file
that every loader process and every run of the same dataset memory-maps (the OS page cache holds
one copy, whatever the number of workers).

Layout of a store folder ``<root>/s<short_side>-<key>/`` (``key``: a digest of the image paths,
their sizes and modification times, and the short side; a changed file makes a new store):

- ``pixels.u8``: the images one after another, each (height, width, 3) uint8 RGB, row-major;
- ``index.npy``: (N, 3) int64, each image's byte offset, height and width (px);
- ``paths.json``: the N image paths, in index order.

A store is written into a temporary folder and renamed into place, under a lock, so concurrent
jobs build it once and a killed build leaves nothing that looks complete.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image

from dmlbench.atomic import exclusive_lock
from dmlbench.data.images import IMAGE_ERRORS, load_rgb
from dmlbench.errors import DmlbenchError

#: Where stores live unless ``DMLBENCH_IMAGE_STORE`` names another folder (relative to the working folder).
DEFAULT_STORE_ROOT = Path(".scratch") / "image_store"
#: The environment variable naming the store root (e.g. a node-local disk on a cluster).
STORE_ROOT_ENV = "DMLBENCH_IMAGE_STORE"
#: Bumped when the layout or the resizing changes, so that old stores are not reused.
STORE_VERSION = 1


class ImageStoreError(DmlbenchError, OSError):
    """An image could not be decoded into the store, or a store folder is damaged."""


def store_root() -> Path:
    """The folder holding the stores: ``$DMLBENCH_IMAGE_STORE``, else :data:`DEFAULT_STORE_ROOT`."""
    return Path(os.environ.get(STORE_ROOT_ENV) or DEFAULT_STORE_ROOT)


def stored_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """``(height, width)`` of an image scaled so that its shorter side is ``short_side`` px, rounded as
    torchvision's ``Resize(short_side)`` rounds it (the longer side truncated).

    >>> stored_size(500, 375, 256), stored_size(375, 500, 256), stored_size(64, 64, 64)
    ((256, 341), (341, 256), (64, 64))
    """
    if width <= height:
        return int(short_side * height / width), short_side
    return short_side, int(short_side * width / height)


def decode_scaled(path: str, short_side: int) -> np.ndarray:
    """The image at ``path`` as (height, width, 3) uint8 RGB with its shorter side ``short_side`` px
    (PIL bilinear, antialiased when shrinking: the pixels the test transform's resize gives)."""
    image = load_rgb(path)
    height, width = stored_size(image.width, image.height, short_side)
    if (width, height) != image.size:
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def store_key(paths: Sequence[str], short_side: int) -> str:
    """A digest of the paths (in order), each file's size and modification time, and the short side."""
    digest = hashlib.sha256(f"dmlbench-image-store v{STORE_VERSION} short_side={short_side}\n".encode())
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError as err:
            raise ImageStoreError(
                f"cannot read image {path}: {err.strerror}; restore the file, or re-run "
                f"`dmlbench prepare` for its dataset"
            ) from err
        digest.update(f"{path}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


class ImageStore:
    """A built store, memory-mapped (copy-on-write: the file is never written).

    Attributes:
        folder: the store folder.
        short_side: the shorter side of every stored image (px).
        paths: the N image paths.
        index: (N, 3) int64 byte offset, height and width of each image.
        row_of: path → row in :attr:`paths`.
    """

    def __init__(self, folder: Path, short_side: int):
        self.folder = Path(folder)
        self.short_side = short_side
        try:
            self.paths: list[str] = json.loads((self.folder / "paths.json").read_text(encoding="utf-8"))
            self.index = np.load(self.folder / "index.npy")
            # copy-on-write: views are writable numpy arrays (torch takes them without a copy), and a
            # write, which nothing does, would change this process's memory, never the file
            self._pixels = np.memmap(self.folder / "pixels.u8", dtype=np.uint8, mode="c")
        except (OSError, ValueError) as err:
            raise self._damaged(str(err)) from err
        ends = self.index[:, 0] + self.index[:, 1] * self.index[:, 2] * 3
        if self.index.shape != (len(self.paths), 3) or (len(ends) and int(ends.max()) > len(self._pixels)):
            raise self._damaged(
                f"index.npy {self.index.shape} does not fit {len(self.paths)} paths and "
                f"{len(self._pixels)} bytes of pixels"
            )
        self.row_of = {path: row for row, path in enumerate(self.paths)}

    def _damaged(self, reason: str) -> ImageStoreError:
        return ImageStoreError(
            f"{self.folder}: damaged image store ({reason}); delete the folder and it is rebuilt at the next run"
        )

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def sizes(self) -> np.ndarray:
        """(N, 2) int64 height and width (px) of each stored image."""
        return self.index[:, 1:]

    def image(self, row: int) -> np.ndarray:
        """Row ``row``'s image: a (height, width, 3) uint8 view of the mapped file."""
        offset, height, width = (int(v) for v in self.index[row])
        return self._pixels[offset : offset + height * width * 3].reshape(height, width, 3)


def _headers(paths: Sequence[str], short_side: int) -> np.ndarray:
    """(N, 3) int64 offset, stored height and width of each image, from the file headers alone."""
    index = np.zeros((len(paths), 3), dtype=np.int64)
    offset = 0
    for row, path in enumerate(paths):
        try:
            with Image.open(path) as image:
                height, width = stored_size(image.width, image.height, short_side)
        except IMAGE_ERRORS as err:
            raise ImageStoreError(
                f"cannot read image {path}: {err}; fix or replace the file, or re-run "
                f"`dmlbench prepare` for its dataset"
            ) from err
        index[row] = offset, height, width
        offset += height * width * 3
    return index


def _fill(job: tuple[str, Sequence[str], np.ndarray, int]) -> None:
    """Decode ``paths`` into the pixel file at their offsets (one building process's share)."""
    pixel_file, paths, index, short_side = job
    pixels = np.memmap(pixel_file, dtype=np.uint8, mode="r+")
    for path, (offset, height, width) in zip(paths, index):
        try:
            array = decode_scaled(path, short_side)
        except IMAGE_ERRORS as err:
            raise ImageStoreError(f"cannot decode image {path}: {err}; fix or replace the file") from err
        if array.shape != (height, width, 3):
            raise ImageStoreError(
                f"{path}: its header says {width}×{height} after scaling but it decodes to "
                f"{array.shape[1]}×{array.shape[0]}; re-save the file"
            )
        pixels[offset : offset + array.size] = array.reshape(-1)
    pixels.flush()


def reserve(path: Path, size: int) -> None:
    """Create ``path`` with ``size`` bytes allocated on disk (``posix_fallocate``), not a sparse file: the
    decoders fill it through a memory map, where a full disk would kill them with SIGBUS and no message.
    A file system that cannot preallocate gets a sparse file, as before.

    Raises:
        ImageStoreError: the disk (or the process's file-size limit) cannot hold ``size`` bytes, naming the
            folder, the size and the fix.
    """
    with open(path, "wb") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, size)
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
                handle.truncate(size)
                return
            free = shutil.disk_usage(path.parent).free
            raise ImageStoreError(
                f"no space left for the decoded-image store in {path.parent}: it needs {size / 2**30:.2f} GB, "
                f"{free / 2**30:.2f} GB are free ({err.strerror}); free {max(size - free, 0) / 2**30:.2f} GB "
                f"there, or point DMLBENCH_IMAGE_STORE at a disk with room"
            ) from err


def _build(folder: Path, paths: Sequence[str], short_side: int, workers: int) -> None:
    """Decode every image into a temporary sibling of ``folder``, then rename it into place. Called under
    the store's lock, so a temporary folder of the same store left by a killed build is swept first."""
    index = _headers(paths, short_side)
    for orphan in folder.parent.glob(f"{folder.name}.tmp-*"):
        shutil.rmtree(orphan, ignore_errors=True)
    temporary = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    temporary.mkdir(parents=True)
    try:
        total = int(index[-1, 0] + index[-1, 1] * index[-1, 2] * 3) if len(paths) else 0
        pixel_file = temporary / "pixels.u8"
        reserve(pixel_file, max(total, 1))
        print(
            f"[dmlbench] decoding {len(paths)} images at short side {short_side} px into {folder} "
            f"({total / 2**30:.2f} GiB, once for every run of this dataset)",
            file=sys.stderr,
            flush=True,
        )
        shares = [(str(pixel_file), paths[i::workers], index[i::workers], short_side) for i in range(workers)]
        if workers > 1:
            with get_context("fork").Pool(workers) as pool:
                pool.map(_fill, shares)
        else:
            _fill(shares[0])
        np.save(temporary / "index.npy", index)
        (temporary / "paths.json").write_text(json.dumps(list(paths)), encoding="utf-8")
        os.replace(temporary, folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def open_store(paths: Sequence[str], short_side: int, workers: int = 1, root: Path | None = None) -> ImageStore:
    """The store of these images at this short side, built first when no job has built it yet.

    Args:
        paths: image files; their order is the store's row order (duplicates are stored once).
        short_side: px of each image's shorter side (``training.image.resize``).
        workers: processes decoding in parallel while building (``training.num_workers``, at least 1).
        root: folder of the stores (default :func:`store_root`).

    Raises:
        ImageStoreError: an image cannot be read or decoded (named, with the fix); nothing is left behind.
    """
    unique = list(dict.fromkeys(str(p) for p in paths))
    root = Path(root) if root is not None else store_root()
    folder = root / f"s{short_side}-{store_key(unique, short_side)}"
    if not folder.is_dir():
        with exclusive_lock(root / f"{folder.name}.lock"):
            if not folder.is_dir():
                _build(folder, unique, short_side, max(1, workers))
    return ImageStore(folder, short_side)
