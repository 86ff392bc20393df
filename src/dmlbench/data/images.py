"""Image files: RGB loading, header checks and bounding-box crops.

Bounding boxes are ``(x, y, w, h)`` in pixels of the stored image (no EXIF
rotation is applied anywhere: the official annotations refer to the stored
pixels), with ``(x, y)`` the top-left corner. In a manifest they are written
as the string ``"x y w h"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from PIL import Image

from dmlbench.errors import DmlbenchError

BBox = tuple[float, float, float, float]

#: How many offending paths an error message lists before summarising the rest.
MAX_LISTED = 100
#: What Pillow raises for a missing, damaged or hostile image file.
IMAGE_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


class ImageCheckError(DmlbenchError, ValueError):
    """One or more images are missing or cannot be read; the message lists them by path."""


def load_rgb(path: str | os.PathLike[str]) -> Image.Image:
    """Decode an image fully and return it in RGB mode.

    Greyscale (``L``; ``I;16`` and other wide modes scaled to 8 bits), CMYK (JPEG, Adobe-inverted or not), palette
    (with or without transparency) and images with alpha all come back as a
    3-channel ``RGB`` image of the same size; alpha is dropped. The file is
    closed before returning.
    """
    with Image.open(path) as opened:
        opened.load()
        img: Image.Image = opened
        if img.mode in WIDE_GREY_MODES:
            img = _grey_to_8bit(img)
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")
        return img.convert("RGB")


#: Greyscale modes wider than 8 bits; PIL's ``convert("RGB")`` clips them to 255 (a 16-bit
#: photograph comes back white) instead of scaling.
WIDE_GREY_MODES = ("I;16", "I;16B", "I;16L", "I", "F")


def _grey_to_8bit(img: Image.Image) -> Image.Image:
    """Scale a 16-bit (``I;16*``: full range 65,535) or 32-bit (``I``, ``F``: 16-bit range when the
    values fit it, else their own maximum) greyscale image to 8-bit ``L``."""
    values = np.asarray(img, dtype=np.float64)
    top = 65535.0 if img.mode.startswith("I;16") or (values.min() >= 0 and values.max() <= 65535) else values.max()
    if img.mode == "F" and values.max() <= 1.0:
        top = 1.0
    scaled = np.clip(np.round(values / max(top, 1e-12) * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def _failures(
    paths: Iterable[str | os.PathLike[str]], check: Callable[[str | os.PathLike[str]], object]
) -> list[tuple[str, str]]:
    """``(path, reason)`` for every path on which ``check`` raises one of :data:`IMAGE_ERRORS`."""
    failures = []
    for path in paths:
        try:
            check(path)
        except IMAGE_ERRORS as err:
            failures.append((str(path), f"{type(err).__name__}: {err}"))
    return failures


def _open_header(path: str | os.PathLike[str]) -> None:
    with Image.open(path) as img:
        if img.width <= 0 or img.height <= 0:
            raise ValueError(f"empty image size {img.size}")


def unreadable_images(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    """Open the header of every image and return ``(path, reason)`` for those that fail.

    Only the header is parsed (format, mode, size), which catches missing,
    empty, truncated-header and non-image files at ~0.1 ms per file; a file
    whose pixel data is damaged behind a valid header is caught later, when
    :func:`load_rgb` decodes it (or by :func:`undecodable_images`).
    """
    return _failures(paths, _open_header)


def undecodable_images(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    """Decode every image fully (:func:`load_rgb`) and return ``(path, reason)`` for those that fail:
    besides what :func:`unreadable_images` finds, files whose pixel data are cut short or damaged
    behind a valid header (~1 ms per image of CUB's size)."""
    return _failures(paths, load_rgb)


def missing_files(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, str]]:
    """``(path, "missing")`` for every path that is not an existing file (a cheap stat each)."""
    return [(str(p), "missing") for p in paths if not os.path.isfile(p)]


def raise_for_failures(failures: list[tuple[str, str]], what: str) -> None:
    """Raise one :class:`ImageCheckError` listing every failure (up to :data:`MAX_LISTED`).

    Args:
        failures: ``(path, reason)`` pairs, e.g. from :func:`unreadable_images`.
        what: the dataset and check, for the first line of the message.
    """
    if not failures:
        return
    lines = [f"  {path}: {reason}" for path, reason in failures[:MAX_LISTED]]
    if len(failures) > MAX_LISTED:
        lines.append(f"  ... and {len(failures) - MAX_LISTED} more")
    raise ImageCheckError(f"{what}: {len(failures)} image(s) missing or unreadable:\n" + "\n".join(lines))


def format_bbox(bbox: BBox) -> str:
    """``(x, y, w, h)`` -> ``"x y w h"`` with the shortest exact-enough decimal form."""
    return " ".join(f"{v:g}" for v in bbox)


def parse_bbox(text: str) -> BBox:
    """``"x y w h"`` -> ``(x, y, w, h)`` floats."""
    x, y, w, h = (float(v) for v in text.split())
    return x, y, w, h


def crop_box(bbox: BBox, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Integer PIL crop box ``(left, top, right, bottom)`` of a bbox, clamped to the image.

    Coordinates are rounded to the nearest pixel; the box keeps at least one
    pixel in each direction even when the annotation lies (partly) outside
    the image, which happens in the official annotations by a few pixels.

    Args:
        bbox: ``(x, y, w, h)`` in pixels.
        size: ``(width, height)`` of the image.
    """
    width, height = size
    x, y, w, h = bbox
    left = min(max(round(x), 0), width - 1)
    top = min(max(round(y), 0), height - 1)
    right = max(min(round(x + w), width), left + 1)
    bottom = max(min(round(y + h), height), top + 1)
    return left, top, right, bottom


def save_crop(src: str | os.PathLike[str], bbox: BBox, dest: Path) -> None:
    """Write the RGB crop of ``src`` to ``dest`` (format from its suffix; JPEG at quality 95)."""
    img = load_rgb(src)
    crop = img.crop(crop_box(bbox, img.size))
    dest.parent.mkdir(parents=True, exist_ok=True)
    crop.save(dest, quality=95)
