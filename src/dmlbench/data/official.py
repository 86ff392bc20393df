"""What the preparers of the official benchmark datasets share.

Each of ``cub200``, ``cars196``, ``sop``, ``inshop`` and ``vehicleid`` parses
its official list files into :class:`Record` s and hands them to
:func:`write_dataset`, which asserts the pinned split counts, checks the image
files, materialises bounding-box crops when asked, and writes the manifest
last. The local copy of a dataset is only ever read: manifest paths point into
it, and crops go under the output directory.

Params section of a real dataset (``datasets.<name>``)::

    kind: cub200          # picks the module
    root: null            # extracted official copy; null -> $DMLBENCH_<KIND>_ROOT
    download: false       # true: the root is the extraction of the official archives in
    raw_dir: data/raw     #   <raw_dir>/<kind>/ (dmlbench.data.download.extract_archives); excludes `root`
    verify_images: decode # false | true (open every header) | decode (every image; default per dataset)
    expected_counts:      # tests'/fixtures' hook: replaces the pinned counts
      train: [n_images, n_classes]
      test: [n_images, n_classes]
    # + the dataset's own options (cropped, test_size), and keys read by other
    #   parts of the pipeline, which are ignored here: label, recall_ks, training
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dmlbench.atomic import atomic_output
from dmlbench.data.images import (
    IMAGE_ERRORS,
    BBox,
    ImageCheckError,
    format_bbox,
    missing_files,
    raise_for_failures,
    save_crop,
    undecodable_images,
    unreadable_images,
)
from dmlbench.data.manifest import SPLITS, ManifestError, assert_split_counts, validate, write_manifest
from dmlbench.errors import DmlbenchError
from dmlbench.paths import contained

#: Keys of a dataset section that belong to other parts of the pipeline.
IGNORED_KEYS: frozenset[str] = frozenset({"kind", "label", "recall_ks", "training"})
#: Keys every real dataset understands.
COMMON_KEYS: frozenset[str] = frozenset({"root", "download", "raw_dir", "verify_images", "expected_counts"})
#: Where ``download: true`` looks for the archives (``<raw_dir>/<kind>/<filename>``) by default.
DEFAULT_RAW_DIR = "data/raw"
#: ``verify_images``: no check, every header (~0.1 ms an image), or every image decoded (~1 ms):
#: the last finds a file cut short behind a valid header before any training is paid for.
VERIFY_CHOICES: tuple[bool | str, ...] = (False, True, "decode")

Counts = dict[str, tuple[int, int]]
"""``{split: (n_images, n_classes)}``."""

#: The fix named by every error about a damaged or edited list file.
RESTORE = "restore this file from the dataset's official archive (re-extract it)"
#: The fix named when images are missing or unreadable.
RESTORE_IMAGES = "Restore these images from the dataset's official archive (re-extract it)."


class DatasetConfigError(DmlbenchError, ValueError):
    """A dataset's params section has an unknown key or a bad value."""


class DatasetNotFoundError(DmlbenchError, FileNotFoundError):
    """No local copy of a dataset, or the copy lacks one of the expected files."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about one official dataset.

    Attributes:
        kind: the ``kind`` in params and the name of ``dmlbench download <kind>``.
        title: human-readable name, used in messages.
        root_name: folder name of the dataset root in the official release.
        homepage: official page, named when the data must be fetched by hand.
        verify_images: default of the ``verify_images`` option.
        options: dataset-specific params keys and their defaults.
        manual: how to obtain the data when ``dmlbench download`` cannot.
    """

    kind: str
    title: str
    root_name: str
    homepage: str
    verify_images: bool | str
    options: Mapping[str, Any] = field(default_factory=dict)
    manual: str = ""

    @property
    def env_var(self) -> str:
        """Environment variable naming the local root, e.g. ``DMLBENCH_CUB200_ROOT``."""
        return f"DMLBENCH_{self.kind.upper()}_ROOT"

    def where_to_point(self) -> str:
        """The sentence that tells a user how to make the data available."""
        return (
            f"Point dmlbench at an extracted copy of the official release: set the environment "
            f"variable {self.env_var}=/path/to/{self.root_name}, or `root: /path/to/{self.root_name}` "
            f"in this dataset's params section (datasets.<name>.root), or run "
            f"`dmlbench download {self.kind}`. See docs/datasets.md."
        )


@dataclass(frozen=True)
class Record:
    """One image of a dataset as the official lists describe it.

    Attributes:
        path: absolute path of the image inside the local copy.
        label: class id of the official release (unique per class).
        class_name: human-readable class name.
        split: one of :data:`dmlbench.data.manifest.SPLITS`.
        bbox: ``(x, y, w, h)`` in pixels, or None.
        source: where the official lists name this image (``"<list file>:<line>"``), for messages;
            empty when unknown.
    """

    path: Path
    label: int
    class_name: str
    split: str
    bbox: BBox | None = None
    source: str = ""


def read_options(config: Mapping[str, Any], info: DatasetInfo) -> dict[str, Any]:
    """Check the keys of a params section and return the options with their defaults.

    Returns:
        ``{"verify_images": bool, **info.options}`` with the values from ``config``.

    Raises:
        DatasetConfigError: an unknown key, a non-boolean ``verify_images`` /
            ``cropped`` / ``download``, a ``raw_dir`` that is not a string, or
            ``download: true`` together with ``root``.
    """
    allowed = IGNORED_KEYS | COMMON_KEYS | set(info.options)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise DatasetConfigError(
            f"{info.title} (kind {info.kind!r}): unknown params key(s) {unknown}; "
            f"allowed: {sorted(allowed - IGNORED_KEYS)} (and {sorted(IGNORED_KEYS)}, read elsewhere)"
        )
    options = {"verify_images": info.verify_images, **info.options}
    options.update({k: config[k] for k in options if config.get(k) is not None})
    if options["verify_images"] not in VERIFY_CHOICES:
        raise DatasetConfigError(
            f"{info.title}: `verify_images` must be false, true (open every header) or "
            f"'decode' (decode every image), got {options['verify_images']!r}"
        )
    if "cropped" in options and not isinstance(options["cropped"], bool):
        raise DatasetConfigError(f"{info.title}: `cropped` must be true or false, got {options['cropped']!r}")
    _check_source(config, info)
    return options


def _check_source(config: Mapping[str, Any], info: DatasetInfo) -> None:
    """The ``download`` / ``raw_dir`` / ``root`` keys: types, and not both sources at once."""
    download = config.get("download")
    if download is not None and not isinstance(download, bool):
        raise DatasetConfigError(f"{info.title}: `download` must be true or false, got {download!r}")
    raw_dir = config.get("raw_dir")
    if raw_dir is not None and not (isinstance(raw_dir, str) and raw_dir):
        raise DatasetConfigError(f"{info.title}: `raw_dir` must be a folder path, got {raw_dir!r}")
    if download and config.get("root"):
        raise DatasetConfigError(
            f"{info.title}: `download: true` and `root: {config['root']}` are both set; choose one: "
            f"`download: true` reads the archives from {raw_dir or DEFAULT_RAW_DIR}/{info.kind}/, "
            f"`root` (or ${info.env_var}) a local copy"
        )


def locate_root(config: Mapping[str, Any], info: DatasetInfo) -> Path:
    """The local copy's root: ``config["root"]``, else ``$DMLBENCH_<KIND>_ROOT``.

    With ``download: true`` it is instead the dataset root inside the
    extraction cache of the official archives,
    ``extract_archives(kind, raw_dir)`` (``raw_dir`` default ``data/raw``),
    which extracts the archives first when needed; the environment variable
    is then ignored.

    Returns:
        Absolute path (not resolved through symlinks) of an existing directory.

    Raises:
        DatasetNotFoundError: neither is set, or the path is not a directory.
            With ``download: true``: an archive is neither in ``raw_dir`` nor
            extracted, or the dataset cannot be downloaded (the message says
            how to get it by hand).
        DatasetConfigError: ``download: true`` together with ``root``.
    """
    _check_source(config, info)
    if config.get("download"):
        from dmlbench.data.download import DownloadError, extract_archives

        try:
            root = extract_archives(info.kind, config.get("raw_dir") or DEFAULT_RAW_DIR)
        except DownloadError as err:
            raise DatasetNotFoundError(f"`download: true`: {err}") from err
        return Path(os.path.abspath(root))
    configured = config.get("root") or os.environ.get(info.env_var)
    if not configured:
        raise DatasetNotFoundError(f"{info.title}: no local copy configured. {info.where_to_point()}")
    path = Path(os.path.abspath(os.path.expanduser(str(configured))))
    if not path.is_dir():
        raise DatasetNotFoundError(f"{info.title}: root {path} is not a directory. {info.where_to_point()}")
    return path


def source_folder(config: Mapping[str, Any], info: DatasetInfo) -> Path | None:
    """The folder the dataset is read from, without extracting anything: ``<raw_dir>/<kind>`` (archives and
    their extraction cache) with ``download: true``, else the local copy's root (``root`` or
    ``$DMLBENCH_<KIND>_ROOT``); None when neither is set (:func:`locate_root` then says so)."""
    if config.get("download"):
        return Path(config.get("raw_dir") or DEFAULT_RAW_DIR) / info.kind
    root = config.get("root") or os.environ.get(info.env_var)
    return Path(os.path.expanduser(str(root))) if root else None


def require(root: Path, info: DatasetInfo, *candidates: str) -> Path:
    """The first of ``candidates`` (paths relative to ``root``) that exists.

    Raises:
        DatasetNotFoundError: naming every candidate tried.
    """
    for rel in candidates:
        if (root / rel).exists():
            return root / rel
    tried = " or ".join(str(root / rel) for rel in candidates)
    raise DatasetNotFoundError(f"{info.title}: expected file {tried} not found. {info.where_to_point()}")


@dataclass(frozen=True)
class ListFile:
    """A whitespace-separated list file of an official release, as :func:`read_list` reads it.

    Attributes:
        path: the file.
        head: ``(line, text)`` of its first non-blank lines (its header), stripped; lines are 1-based.
        rows: ``(line, cells)`` of every later non-blank line.
    """

    path: Path
    head: list[tuple[int, str]]
    rows: list[tuple[int, list[str]]]

    def where(self, line: int) -> str:
        """``"<file>:<line>"``, the prefix of a message about one line."""
        return f"{self.path}:{line}"

    def check_header(self, expected: str) -> None:
        """Stop unless the last head line is ``expected`` (whitespace-insensitive).

        Raises:
            ManifestError: naming the line, the expected and the found header.
        """
        line, text = self.head[-1]
        if text.split() != expected.split():
            raise ManifestError(f"{self.where(line)}: expected the header {expected!r}, found {text[:80]!r}; {RESTORE}")


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """``(line, stripped text)`` of every non-blank line (1-based; LF, CRLF or CR; a UTF-8 BOM dropped).

    Raises:
        ManifestError: a line that is not UTF-8 (file and line named).
    """
    lines = []
    for number, line_bytes in enumerate(Path(path).read_bytes().splitlines(), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ManifestError(
                f"{path}:{number}: not UTF-8 text ({err.reason} at byte {err.start}): "
                f"{line_bytes[:80]!r}; the official list files are UTF-8 (or ASCII): "
                f"{RESTORE}"
            ) from err
        text = (line.removeprefix("\ufeff") if number == 1 else line).strip()
        if text:
            lines.append((number, text))
    return lines


def read_list(path: Path, n_columns: int, n_head: int = 0) -> ListFile:
    """Read a list file: ``n_head`` header lines, then rows of ``n_columns`` whitespace-separated cells.

    Blank lines are skipped wherever they are; the line numbers are those of the file.

    Raises:
        ManifestError: a line that is not UTF-8, no row after the header, or a row with a different
            number of columns (file and line named).
    """
    lines = _text_lines(path)
    if len(lines) <= n_head:
        raise ManifestError(
            f"{path}: no rows (the file is empty{' or holds only its header' if n_head else ''}); {RESTORE}"
        )
    rows = []
    for number, text in lines[n_head:]:
        cells = text.split()
        if len(cells) != n_columns:
            raise ManifestError(
                f"{path}:{number}: expected {n_columns} columns, found {len(cells)}: {text!r}; {RESTORE}"
            )
        rows.append((number, cells))
    return ListFile(Path(path), lines[:n_head], rows)


def parse_id(where: str, text: str, what: str, minimum: int = 1) -> int:
    """A class / item / vehicle id cell as an integer of at least ``minimum``.

    Args:
        where: ``"<file>:<line>"`` of the cell, named in the error.
        what: the column's name in the release, e.g. ``class_id``.

    Raises:
        ManifestError: not a plain decimal integer (``3.0``, ``-3``, ``abc``) or below ``minimum``.
    """
    if not (text.isascii() and text.isdigit()) or int(text) < minimum:
        raise ManifestError(f"{where}: {what} must be an integer >= {minimum}, found {text!r}; {RESTORE}")
    return int(text)


def parse_item_id(where: str, text: str) -> int:
    """The number of an ``id_<digits>`` item id (``id_00000002`` -> 2), as :func:`parse_id` checks it."""
    match = re.fullmatch(r"id_(\d+)", text)
    if match is None:
        raise ManifestError(f"{where}: item_id must look like 'id_00000001', found {text!r}; {RESTORE}")
    return parse_id(where, match.group(1), "the number of item_id")


def image_path(base: Path, name: str, where: str) -> Path:
    """``base / name`` for an image named by a list file, refusing a name that leaves ``base``.

    Raises:
        ManifestError: an empty or absolute name, or one with a ``..`` component (``where`` named).
    """
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts:
        raise ManifestError(f"{where}: image name {name!r} is not a path inside {base}; {RESTORE}")
    return base / rel


def read_numbers(where: str, cells: list[str]) -> tuple[float, ...]:
    """``cells`` as finite floats; a bad cell names ``where`` (``"<file>:<line>"``), the values and the fix."""
    try:
        values = tuple(float(v) for v in cells)
    except ValueError as err:
        raise ManifestError(f"{where}: expected numbers, found {cells}; {RESTORE}") from err
    if not all(math.isfinite(v) for v in values):
        raise ManifestError(f"{where}: non-finite number in {cells}; {RESTORE}")
    return values


def expected_counts(config: Mapping[str, Any], pinned: Counts, info: DatasetInfo) -> Counts:
    """The pinned counts, or the ``expected_counts`` override of the params section.

    The override is the hook that lets miniature fixtures run through the
    same code path as the real data: ``{split: [n_images, n_classes]}``.
    """
    override = config.get("expected_counts")
    if override is None:
        return dict(pinned)
    if not isinstance(override, Mapping):
        raise DatasetConfigError(f"{info.title}: `expected_counts` must map split -> [n_images, n_classes]")
    counts: Counts = {}
    for split, value in override.items():
        ok = split in SPLITS and isinstance(value, Sequence) and len(value) == 2
        if not ok or not all(isinstance(v, int) and v >= 0 for v in value):
            raise DatasetConfigError(
                f"{info.title}: expected_counts.{split} = {value!r}; need a split in {list(SPLITS)} "
                f"mapped to [n_images, n_classes]"
            )
        counts[split] = (value[0], value[1])
    return counts


def write_dataset(
    records: Iterable[Record],
    out_dir: Path,
    *,
    info: DatasetInfo,
    expected: Counts,
    sources: Mapping[str, str],
    verify: bool | str,
    crop_base: Path | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
) -> Path:
    """Check the records and write ``out_dir/manifest.csv`` (the last file written).

    In order: that no image is listed twice, class-disjointness of ``train``
    and the evaluation splits, the split counts (per split, naming the list
    file it came from), that every image exists, optionally that every image
    header opens or decodes; then the crops, ``tables`` and the manifest. All
    problems of one kind are reported in a single error, naming the list rows
    (:attr:`Record.source`) at fault. When a check fails nothing is written.
    ``out_dir`` is a new folder: :func:`dmlbench.data.registry.prepare_dataset` builds the dataset
    beside its place and swaps it in when complete (a failed prepare leaves the old one).

    Args:
        expected: ``{split: (n_images, n_classes)}`` to assert.
        sources: ``{split: list file}`` named in count errors.
        verify: open every image header (True, :func:`dmlbench.data.images.unreadable_images`) or
            decode every image ("decode", :func:`dmlbench.data.images.undecodable_images`).
        crop_base: when set, write the bbox crop of every image to
            ``out_dir/images/<path relative to crop_base>`` and point the
            manifest there (relative paths, no ``bbox`` column); otherwise the
            manifest points into the local copy and keeps a ``bbox`` column
            when the records have boxes.
        tables: ``{file name: table}`` written as CSV into ``out_dir`` after the checks, before the manifest.

    Returns:
        Path of the manifest.
    """
    records = list(records)
    frame = pd.DataFrame(
        {
            "path": [str(r.path) for r in records],
            "label": [r.label for r in records],
            "class_name": [r.class_name for r in records],
            "split": [r.split for r in records],
        }
    )
    _assert_listed_once(records)
    _assert_class_disjoint(records, info)
    for split, counts in expected.items():
        assert_split_counts(frame, {split: counts}, source=f"{info.title} ({sources.get(split, 'list files')})")

    _raise_for_images(missing_files(frame["path"]), info.title, records)
    if verify == "decode":
        _raise_for_images(undecodable_images(frame["path"]), f"{info.title} (verify_images: decode)", records)
    elif verify:
        _raise_for_images(unreadable_images(frame["path"]), f"{info.title} (verify_images)", records)
    validate(frame, source=f"{info.title} ({', '.join(sorted(set(sources.values())))})")

    if crop_base is not None:
        frame["path"] = _materialise_crops(records, crop_base, out_dir, info)
    elif any(r.bbox is not None for r in records):
        frame["bbox"] = [format_bbox(r.bbox) if r.bbox is not None else "" for r in records]
    for name, table in (tables or {}).items():
        with atomic_output(out_dir / name) as tmp:
            table.to_csv(tmp, index=False, lineterminator="\n")
    return write_manifest(frame, out_dir / "manifest.csv")


def _where(record: Record) -> str:
    """The list row of a record, or its image path when the preparer gave none."""
    return record.source or str(record.path)


def _assert_listed_once(records: list[Record]) -> None:
    """Every image file is listed once: a repeated test image is its own nearest neighbour."""
    first: dict[Path, Record] = {}
    repeated = []
    for record in records:
        earlier = first.setdefault(record.path, record)
        if earlier is not record:
            repeated.append((earlier, record))
    if repeated:
        earlier, later = repeated[0]
        raise ManifestError(
            f"{_where(later)}: image {later.path} is listed again (first at {_where(earlier)}); "
            f"{len(repeated)} repeated listing(s) in all. Each image is listed once: {RESTORE}"
        )


def _assert_class_disjoint(records: list[Record], info: DatasetInfo) -> None:
    """Zero-shot protocol: no class of ``train`` may appear in an evaluation split."""
    train = {r.label: r for r in reversed(records) if r.split == "train"}
    clashes = {r.label: r for r in reversed(records) if r.split != "train" and r.label in train}
    if clashes:
        shared = sorted(clashes)
        clash = clashes[shared[0]]
        raise ManifestError(
            f"{info.title}: {len(shared)} class(es) appear in both train and an evaluation split "
            f"(e.g. {shared[:5]}): class {clash.label} is in train at {_where(train[clash.label])} and in "
            f"{clash.split} at {_where(clash)}; the benchmark protocol needs class-disjoint splits: {RESTORE}"
        )


def _raise_for_images(failures: list[tuple[str, str]], what: str, records: list[Record]) -> None:
    """:func:`dmlbench.data.images.raise_for_failures`, each image with the list row naming it, plus the fix."""
    if not failures:
        return
    source = {str(r.path): r.source for r in records if r.source}
    named = [(path, f"{reason} (listed at {source[path]})" if path in source else reason) for path, reason in failures]
    try:
        raise_for_failures(named, what)
    except ImageCheckError as err:
        raise ImageCheckError(f"{err}\n{RESTORE_IMAGES}") from None


def _materialise_crops(records: list[Record], crop_base: Path, out_dir: Path, info: DatasetInfo) -> list[str]:
    """Write every bbox crop under ``out_dir/images`` (``out_dir`` is the new folder that
    :func:`dmlbench.data.registry.prepare_dataset` swaps in when complete).

    Returns:
        Manifest paths of the crops, relative to ``out_dir``.
    """
    images = out_dir / "images"
    paths, failures = [], []
    for record in records:
        if record.bbox is None:
            raise ManifestError(f"{info.title}: {record.path} has no bounding box to crop to")
        rel = record.path.relative_to(crop_base)
        dest = contained(images, rel)  # a listed `../` path must not write outside the crops' folder
        try:
            save_crop(record.path, record.bbox, dest)
        except IMAGE_ERRORS as err:
            failures.append((str(record.path), f"{type(err).__name__}: {err}"))
        paths.append(str(Path("images") / rel))
    raise_for_failures(failures, f"{info.title} (cropping)")
    return paths
