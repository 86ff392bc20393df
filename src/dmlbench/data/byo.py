"""Your own dataset: an image folder (``kind: folder``) or a CSV list of images (``kind: manifest``).

Both end in the canonical manifest (:mod:`dmlbench.data.manifest`, absolute paths into your files, which
are only ever read) with class-disjoint ``train`` / ``test`` splits, like the official datasets.

``kind: folder`` — an ImageFolder layout ``root/<class>/<image>``::

    kind: folder
    root: /data/my_birds      # null -> $DMLBENCH_FOLDER_ROOT
    split_file: null          # optional CSV `class,split` (path relative to root); else the seeded rule
    train_fraction: 0.5       # the seeded rule (below)
    split_seed: 0
    verify_images: true       # false | true (open every header) | decode (decode every image)

Every sub-folder of ``root`` is a class, named by the folder; its images are the files below it
(sub-folders included) whose extension is one of :data:`IMAGE_EXTENSIONS` (any case). Labels are the
positions of the class folders sorted by name (Python's string order, as torchvision's ImageFolder:
``0..C-1``). Skipped, and listed in ``skipped.csv`` beside the manifest and counted on stderr: hidden
files and folders (a name starting with ``.``: ``.DS_Store``, macOS ``._x.jpg``), files with another
extension, and files directly in ``root``.

``kind: manifest`` — a CSV file with the header ``path,label[,split][,class_name][,bbox]`` (OML's
format without its query/gallery columns)::

    kind: manifest
    csv: /data/products/list.csv   # null -> $DMLBENCH_MANIFEST_CSV
    train_fraction: 0.5            # the seeded rule, when the CSV has no `split` column
    split_seed: 0
    verify_images: true

``path`` is relative to the CSV's folder and must stay inside it (no absolute path, no ``..``: refused
with the line); ``label`` a non-negative integer below 2**63 (the class id); ``split`` ``train`` or
``test`` on every row (``val`` is carved from the train classes at training time,
``training.val_fraction``); ``class_name`` defaults to the label; ``bbox`` is ``"x y w h"`` in pixels
or empty. Cells are stripped of surrounding blanks; blank lines are skipped.

The seeded rule (:func:`seeded_train_classes`), used without a split file / ``split`` column: the
classes in sorted order (folder names; labels ascending), permuted by
``numpy.random.default_rng(split_seed).permutation``; the first ``n_train = floor(train_fraction * C
+ 0.5)`` of the permutation are ``train``, the rest ``test``.

Checked before anything is written, each error naming the file (and line, folder or key) and the fix:
the root / CSV exists; at least :data:`MIN_IMAGES_PER_CLASS` images in every class (a query needs a
same-class neighbour) and :data:`MIN_CLASSES_PER_SPLIT` classes in each split; in a CSV, the header,
every cell, no image listed twice, one class name and one split per label; every image exists, and
with ``verify_images`` opens (or decodes).
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from dmlbench.atomic import atomic_output
from dmlbench.data.images import raise_for_failures, undecodable_images, unreadable_images
from dmlbench.data.manifest import LABEL_RANGE, _box_problem, write_manifest
from dmlbench.data.official import IGNORED_KEYS, DatasetConfigError, DatasetNotFoundError
from dmlbench.errors import DmlbenchError, did_you_mean
from dmlbench.paths import PathOutsideError, contained

#: Image files of a class folder, by extension (any case): torchvision's ImageFolder's list.
IMAGE_EXTENSIONS: tuple[str, ...] = (".bmp", ".jpeg", ".jpg", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp")
#: The splits of your own dataset.
SPLITS: tuple[str, ...] = ("train", "test")
#: A query needs a same-class neighbour, a batch two images of its class.
MIN_IMAGES_PER_CLASS = 2
#: Each split needs two classes (a test split of one class is trivially retrieved).
MIN_CLASSES_PER_SPLIT = 2
#: The largest class id: labels are stored as int64 (the manifest's range).
MAX_LABEL = LABEL_RANGE[1]
#: Environment variables read when ``root`` / ``csv`` is null.
FOLDER_ENV = "DMLBENCH_FOLDER_ROOT"
MANIFEST_ENV = "DMLBENCH_MANIFEST_CSV"
#: The params keys of each kind (besides :data:`dmlbench.data.official.IGNORED_KEYS`), with defaults.
DEFAULTS: dict[str, dict[str, Any]] = {
    "folder": {"root": None, "split_file": None, "train_fraction": 0.5, "split_seed": 0, "verify_images": True},
    "manifest": {"csv": None, "train_fraction": 0.5, "split_seed": 0, "verify_images": True},
}
#: The columns of a ``kind: manifest`` CSV.
CSV_REQUIRED: tuple[str, ...] = ("path", "label")
CSV_OPTIONAL: tuple[str, ...] = ("split", "class_name", "bbox")
#: Where the format is described, named by the errors.
DOCS = "docs/datasets.md, section 'Your own dataset'"
#: Written beside the manifest when the folder scan skipped files.
SKIPPED_FILE = "skipped.csv"


class OwnDatasetError(DmlbenchError, ValueError):
    """Your own dataset's folder, CSV or split file cannot make a benchmark; the message names where and the fix."""


# --- params ---------------------------------------------------------------------------------------


def read_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The section's options with their defaults (:data:`DEFAULTS`), checked.

    Raises:
        DatasetConfigError: an unknown key (with the allowed ones), or a bad value (key named).
    """
    kind = config["kind"]
    defaults = DEFAULTS[kind]
    unknown = sorted(set(config) - set(defaults) - IGNORED_KEYS)
    if unknown:
        raise DatasetConfigError(
            f"kind {kind!r}: unknown params key(s) {unknown}"
            f"{did_you_mean(unknown[0], defaults)}; allowed: {sorted(defaults)} "
            f"(and {sorted(IGNORED_KEYS)}, read elsewhere). See {DOCS}."
        )
    options = {key: config[key] if config.get(key) is not None else default for key, default in defaults.items()}
    verify = options["verify_images"]
    if not (isinstance(verify, bool) or verify == "decode"):
        raise DatasetConfigError(
            f"kind {kind!r}: `verify_images` must be false, true (open every header) or "
            f"'decode' (decode every image), got {verify!r}"
        )
    fraction = options["train_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise DatasetConfigError(
            f"kind {kind!r}: `train_fraction` must be a number between 0 and 1 (the share "
            f"of classes in train), got {fraction!r}"
        )
    seed = options["split_seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DatasetConfigError(f"kind {kind!r}: `split_seed` must be an integer >= 0, got {seed!r}")
    for key in ("root", "csv", "split_file"):
        value = options.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise DatasetConfigError(f"kind {kind!r}: `{key}` must be a path, got {value!r}")
    return options


def _configured(config: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """``(key, environment variable, value)`` of where the section's data is: ``root`` / ``csv``, else the
    variable; value None when neither is set."""
    key, env = ("root", FOLDER_ENV) if config.get("kind") == "folder" else ("csv", MANIFEST_ENV)
    value = config.get(key) or os.environ.get(env)
    return key, env, value


def source_path(config: Mapping[str, Any]) -> Path | None:
    """The folder (``kind: folder``) or CSV file (``kind: manifest``) the dataset is read from, without
    checking it (:func:`dmlbench.data.registry.check_out_dir` refuses an output inside or equal to it);
    None when not configured (``prepare`` then says so)."""
    value = _configured(config)[2]
    return Path(os.path.expanduser(str(value))) if value else None


def _locate(config: Mapping[str, Any], want_dir: bool) -> Path:
    """The configured root folder / CSV file as an absolute path, which must exist.

    Raises:
        DatasetNotFoundError: not configured, or not an existing folder / file (the key and variable named).
    """
    key, env, value = _configured(config)
    what = "an image folder root/<class>/<image>" if want_dir else "a CSV file path,label[,split]"
    how = f"set `{key}:` in the dataset's params section (datasets.<name>.{key}) or the environment variable {env}"
    if not value:
        raise DatasetNotFoundError(f"kind {config['kind']!r}: no data configured: {how} to {what}. See {DOCS}.")
    path = Path(os.path.abspath(os.path.expanduser(str(value))))
    source = f"`{key}: {value}`" if config.get(key) else f"${env}={value}"
    if want_dir and not path.is_dir():
        raise DatasetNotFoundError(f"{source}: {path} is not a folder; {how} to {what}")
    if not want_dir and not path.is_file():
        raise DatasetNotFoundError(f"{source}: {path} is not a file; {how} to {what}")
    return path


# --- the split ------------------------------------------------------------------------------------


def seeded_train_classes(classes: Sequence[Any], train_fraction: float, seed: int) -> set[Any]:
    """The train classes of the seeded rule: ``classes`` (in sorted order) permuted by
    ``numpy.random.default_rng(seed).permutation``; the first ``floor(train_fraction * C + 0.5)`` of them.

    >>> sorted(seeded_train_classes(["a", "b", "c", "d"], 0.5, seed=0))  # the permutation is [2, 0, 1, 3]
    ['a', 'c']
    """
    n_train = math.floor(train_fraction * len(classes) + 0.5)
    order = np.random.default_rng(seed).permutation(len(classes))
    return {classes[i] for i in order[:n_train]}


def _check_split_sizes(split_of: Mapping[Any, str], what: str, fix: str) -> None:
    """At least :data:`MIN_CLASSES_PER_SPLIT` classes in each split."""
    counts = Counter(split_of.values())
    short = [split for split in SPLITS if counts[split] < MIN_CLASSES_PER_SPLIT]
    if short:
        found = ", ".join(f"{counts[s]} {s}" for s in SPLITS)
        raise OwnDatasetError(
            f"{what}: {found} class(es); each split needs at least {MIN_CLASSES_PER_SPLIT} "
            f"classes (train to learn from, test to retrieve among); {fix}"
        )


# --- CSV files ------------------------------------------------------------------------------------


def _read_csv(
    path: Path, required: Sequence[str], optional: Sequence[str], hint: str = ""
) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """A UTF-8 CSV file with a header: ``(columns, [(line, {column: stripped cell})])``, 1-based lines of the
    file, blank lines skipped.

    Raises:
        OwnDatasetError: not UTF-8, no header or no row, a header with a missing, unknown or repeated
            column, or a row with another number of cells (file and line named).
    """
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise OwnDatasetError(
            f"{path}:{line}: not UTF-8 text ({err.reason} at byte {err.start}); save the file as UTF-8 (CSV UTF-8)"
        ) from err
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    header: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    expected = ",".join([*required, *(f"[{c}]" for c in optional)])
    try:
        for cells in reader:
            cells = [cell.strip() for cell in cells]
            if not any(cells):
                continue
            if header is None:
                header = cells
                _check_header(path, reader.line_num, header, required, optional, expected, hint)
                continue
            if len(cells) != len(header):
                raise OwnDatasetError(
                    f"{path}:{reader.line_num}: {len(cells)} cell(s), the header has "
                    f"{len(header)} ({','.join(header)}): {','.join(cells)[:120]!r}; give every "
                    f"row one cell per column (quote a cell that holds a comma)"
                )
            rows.append((reader.line_num, dict(zip(header, cells, strict=True))))
    except csv.Error as err:
        raise OwnDatasetError(f"{path}:{reader.line_num}: not a valid CSV row ({err}); check its quotes") from err
    if header is None:
        raise OwnDatasetError(f"{path}: empty; write the header {expected} and one row per entry")
    if not rows:
        raise OwnDatasetError(f"{path}: only a header, no rows; add one row per entry")
    return header, rows


def _check_header(
    path: Path, line: int, header: list[str], required: Sequence[str], optional: Sequence[str], expected: str, hint: str
) -> None:
    repeated = sorted(name for name, n in Counter(header).items() if n > 1)
    if repeated:
        raise OwnDatasetError(
            f"{path}:{line}: column(s) {repeated} appear more than once in the header; "
            f"name each column once ({expected})"
        )
    missing = [name for name in required if name not in header]
    if missing:
        raise OwnDatasetError(
            f"{path}:{line}: the header {','.join(header)[:120]!r} lacks the column(s) "
            f"{missing}; the first line must be the header {expected} (comma-separated)"
        )
    unknown = [name for name in header if name not in (*required, *optional)]
    if unknown:
        raise OwnDatasetError(
            f"{path}:{line}: unknown column(s) {unknown}"
            f"{did_you_mean(unknown[0], [*required, *optional])}; allowed: {expected}{hint}"
        )


# --- common checks and the output ---------------------------------------------------------------------


def _check_class_sizes(members: Mapping[Any, list[str]], describe: Mapping[Any, str], fix: str) -> None:
    """Every class has at least :data:`MIN_IMAGES_PER_CLASS` images; ``describe`` names each class (its
    folder, or its label and lines)."""
    small = [c for c, images in members.items() if len(images) < MIN_IMAGES_PER_CLASS]
    if small:
        listed = "; ".join(f"{describe[c]}: {len(members[c])} image(s)" for c in small[:5])
        more = f" and {len(small) - 5} more" if len(small) > 5 else ""
        raise OwnDatasetError(
            f"{len(small)} class(es) with fewer than {MIN_IMAGES_PER_CLASS} images: {listed}"
            f"{more}. Retrieval needs at least {MIN_IMAGES_PER_CLASS} images per class (a "
            f"query needs a same-class neighbour): {fix}"
        )


def _check_images(paths: Sequence[str], where: Mapping[str, str], verify: bool | str, fix: str) -> None:
    """Every image exists; with ``verify`` its header opens (True) or it decodes ("decode")."""
    failures = [(p, "missing (no such file)") for p in paths if not os.path.isfile(p)]
    if not failures and verify:
        failures = (undecodable_images if verify == "decode" else unreadable_images)(paths)
    try:
        raise_for_failures(
            [(p, f"{reason}{where.get(p, '')}") for p, reason in failures],
            "your dataset" + (f" (verify_images: {str(verify).lower()})" if verify else ""),
        )
    except DmlbenchError as err:
        raise OwnDatasetError(f"{err}\n{fix}") from None


def _write(out_dir: Path, rows: list[dict[str, Any]], skipped: list[tuple[str, str]], source: Path) -> Path:
    """``skipped.csv`` (when anything was skipped, with a line on stderr), then the manifest, last."""
    if skipped:
        with atomic_output(out_dir / SKIPPED_FILE) as tmp:
            pd.DataFrame(skipped, columns=["path", "reason"]).to_csv(tmp, index=False, lineterminator="\n")
        examples = ", ".join(path for path, _ in skipped[:3])
        print(
            f"{source}: skipped {len(skipped)} file(s) that are not images of a class (e.g. {examples}); "
            f"listed in {SKIPPED_FILE} beside the manifest",
            file=sys.stderr,
        )
    return write_manifest(pd.DataFrame(rows), out_dir / "manifest.csv")


def _utf8(name: str, where: Path) -> str:
    """``name``, refused when it is not valid UTF-8 (undecodable bytes kept as surrogates by the OS layer)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as err:
        raise OwnDatasetError(f"{where}: the name {name!r} is not valid UTF-8; rename it") from err
    return name


# --- kind: folder ---------------------------------------------------------------------------------


def scan_folder(root: Path) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    """The class folders of ``root`` and their images, and what was skipped.

    Returns:
        ``({class folder name: [image path relative to root (POSIX), sorted]}, [(path relative to root,
        reason)])``; classes in sorted order.
    """
    classes: dict[str, list[str]] = {}
    skipped: list[tuple[str, str]] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        name = _utf8(entry.name, root / entry.name)
        if name.startswith("."):
            skipped.append((name, "hidden"))
        elif entry.is_dir():
            classes[name] = _class_images(root, name, skipped)
        else:
            skipped.append((name, "not in a class folder"))
    return classes, skipped


def _class_images(root: Path, name: str, skipped: list[tuple[str, str]]) -> list[str]:
    """The image files below ``root/name`` (sub-folders included, hidden ones skipped), sorted."""
    images = []
    for folder, dirnames, filenames in os.walk(root / name):
        rel = Path(folder).relative_to(root).as_posix()
        for hidden in [d for d in dirnames if d.startswith(".")]:
            skipped.append((f"{rel}/{hidden}", "hidden"))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for filename in sorted(filenames):
            path = _utf8(f"{rel}/{filename}", Path(folder) / filename)
            if filename.startswith("."):
                skipped.append((path, "hidden"))
            elif not filename.lower().endswith(IMAGE_EXTENSIONS):
                skipped.append((path, "not an image extension"))
            else:
                images.append(path)
    return images


def _split_file(root: Path, name: str, classes: Sequence[str]) -> tuple[Path, dict[str, str]]:
    """``{class: split}`` from the split file (``class,split``, every class folder once).

    Raises:
        OwnDatasetError: a bad header or row, an unknown split, a class that is not a folder of ``root``,
            listed twice, or a class folder not listed (file, line and fix named).
    """
    path = Path(os.path.expanduser(name))
    path = path if path.is_absolute() else root / path
    if not path.is_file():
        raise DatasetNotFoundError(
            f"`split_file: {name}`: {path} is not a file; give a CSV `class,split` "
            f"(a path relative to the root {root}, or absolute), or remove the key to "
            f"use the seeded rule (train_fraction, split_seed)"
        )
    _, rows = _read_csv(path, ("class", "split"), ())
    split_of: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for line, row in rows:
        where = f"{path}:{line}"
        cls, split = row["class"], row["split"]
        _check_split_value(where, split)
        if cls not in classes:
            raise OwnDatasetError(
                f"{where}: class {cls!r} is not a class folder of {root}"
                f"{did_you_mean(cls, classes)}; write the folder's name as it is"
            )
        if cls in split_of:
            raise OwnDatasetError(
                f"{where}: class {cls!r} is listed again (first on line {first_line[cls]}, "
                f"as {split_of[cls]}); list every class once: a class in both splits would "
                f"be tested on images it was trained on"
            )
        split_of[cls], first_line[cls] = split, line
    unlisted = [c for c in classes if c not in split_of]
    if unlisted:
        raise OwnDatasetError(
            f"{path}: {len(unlisted)} class folder(s) of {root} not listed, e.g. "
            f"{unlisted[:5]}; add a line `<class>,train` or `<class>,test` for each (or "
            f"move the folder out of the root)"
        )
    return path, split_of


def _check_split_value(where: str, split: str) -> None:
    if split in SPLITS:
        return
    hints = {
        "val": " (the validation classes are carved from train at training time: training.val_fraction)",
        "validation": " (OML's 'validation' is the test split here: write test)",
        "query": " (queries and gallery are the whole test split here: write test)",
        "gallery": " (queries and gallery are the whole test split here: write test)",
        "": " (the cell is empty)",
    }
    fix = hints.get(split, did_you_mean(split, SPLITS)) or hints.get(split.lower(), "")
    raise OwnDatasetError(f"{where}: split {split!r} is neither 'train' nor 'test'{fix}; write train or test")


def _skipped_in(name: str, skipped: Sequence[tuple[str, str]], limit: int = 3) -> str:
    """`` (skipped: <path> (<reason>), ...)`` for the skipped files of class folder ``name``, or ``""``."""
    inside = [f"{path} ({reason})" for path, reason in skipped if path.startswith(f"{name}/")]
    more = f" and {len(inside) - limit} more" if len(inside) > limit else ""
    return f" (skipped: {', '.join(inside[:limit])}{more})" if inside else ""


def prepare_folder(config: Mapping[str, Any], out_dir: Path) -> Path:
    """``kind: folder``: scan the class folders, split them, check them, write the manifest."""
    options = read_options(config)
    root = _locate(config, want_dir=True)
    classes, skipped = scan_folder(root)
    names = list(classes)
    if not names:
        raise OwnDatasetError(
            f"{root}: no class folders; the layout is root/<class>/<image>: one sub-folder "
            f"per class holding its images. See {DOCS}."
        )
    if options["split_file"] is not None:
        if any(config.get(key) is not None for key in ("train_fraction", "split_seed")):
            raise DatasetConfigError(
                "kind 'folder': `split_file` and `train_fraction` / `split_seed` are both "
                "set; the split file decides the split: remove one"
            )
        split_path, split_of = _split_file(root, options["split_file"], names)
        skipped = [entry for entry in skipped if root / entry[0] != split_path]  # the split file is no stray file
        how = f"split file {options['split_file']}"
    else:
        train = seeded_train_classes(names, options["train_fraction"], options["split_seed"])
        split_of = {name: "train" if name in train else "test" for name in names}
        how = f"train_fraction {options['train_fraction']}, split_seed {options['split_seed']}"
    _check_class_sizes(
        classes,
        {c: f"{root / c}/{_skipped_in(c, skipped)}" for c in names},
        "add images to these folders or move them out of the root",
    )
    _check_split_sizes(
        split_of,
        f"{root} ({len(names)} class folders; {how})",
        "add class folders, or change train_fraction or the split file",
    )
    rows: list[dict[str, Any]] = [
        {"path": str(root / rel), "label": label, "class_name": name, "split": split_of[name]}
        for label, name in enumerate(names)
        for rel in classes[name]
    ]
    _check_images(
        [row["path"] for row in rows],
        {},
        options["verify_images"],
        "Replace or remove these files (or move them out of the class folders).",
    )
    return _write(out_dir, rows, skipped, root)


# --- kind: manifest -------------------------------------------------------------------------------


OML_HINT = (
    " (OML's is_query / is_gallery: here every test image is a query against the rest of the test "
    "split; drop those columns, and write OML's 'validation' split as test)"
)


def _parse_label(where: str, text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise OwnDatasetError(
            f"{where}: label {text!r} is not a non-negative integer; write the class id as "
            f"digits (0, 1, 2, ...; one id per class)"
        )
    if int(text) > MAX_LABEL:
        raise OwnDatasetError(
            f"{where}: label {text} overflows a 64-bit integer (at most {MAX_LABEL}); "
            f"number the classes with smaller ids"
        )
    return int(text)


def _image_path(base: Path, where: str, text: str) -> tuple[str, Path]:
    """The normalised relative path of a ``path`` cell and the file it names, which stays inside ``base``.

    Raises:
        OwnDatasetError: an empty or absolute path, or one with a ``..`` component.
    """
    rel = PurePosixPath(text)
    if not text:
        raise OwnDatasetError(f"{where}: empty path; every row names one image file, relative to {base}")
    if rel.is_absolute() or text.startswith("~") or ".." in rel.parts:
        raise OwnDatasetError(
            f"{where}: path {text!r} leaves the CSV's folder {base}; write paths relative to "
            f"that folder, without a leading '/' or '~' and without '..' (move the CSV up, or "
            f"the images under it)"
        )
    try:
        return rel.as_posix(), contained(base, rel.as_posix())
    except PathOutsideError as err:  # the check above already refuses it: a second line of defence
        raise OwnDatasetError(f"{where}: {err}") from err


def prepare_manifest(config: Mapping[str, Any], out_dir: Path) -> Path:
    """``kind: manifest``: read the CSV, split it when it has no ``split`` column, check it, write the manifest."""
    options = read_options(config)
    csv_path = _locate(config, want_dir=False)
    base = csv_path.parent
    header, rows = _read_csv(csv_path, CSV_REQUIRED, CSV_OPTIONAL, OML_HINT)
    has_split = "split" in header
    if has_split and any(config.get(key) is not None for key in ("train_fraction", "split_seed")):
        raise DatasetConfigError(
            f"kind 'manifest': `train_fraction` / `split_seed` are set but {csv_path} has a "
            "`split` column, which decides the split: remove one"
        )
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    repeated: list[tuple[int, int, str]] = []
    for line, row in rows:
        where = f"{csv_path}:{line}"
        rel, path = _image_path(base, where, row["path"])
        if rel in seen:
            repeated.append((seen[rel], line, rel))
        seen.setdefault(rel, line)
        record: dict[str, Any] = {"line": line, "path": str(path), "label": _parse_label(where, row["label"])}
        if has_split:
            _check_split_value(where, row["split"])
            record["split"] = row["split"]
        if "class_name" in header:
            if not row["class_name"]:
                raise OwnDatasetError(
                    f"{where}: empty class_name; name the class, or drop the column (the label is then the name)"
                )
            record["class_name"] = row["class_name"]
        if "bbox" in header:
            problem = _box_problem(row["bbox"])
            if problem is not None:
                raise OwnDatasetError(
                    f"{where}: bbox {row['bbox']!r}: {problem}; write 'x y w h' in pixels of "
                    f"the image file, or leave the cell empty"
                )
            record["bbox"] = row["bbox"]
        records.append(record)
    if repeated:
        first, line, rel = repeated[0]
        raise OwnDatasetError(
            f"{csv_path}:{line}: image {rel!r} is listed again (first on line {first}); "
            f"{len(repeated)} repeated row(s) in all. List every image once (a repeated test "
            f"image would be its own nearest neighbour): remove the repeated rows"
        )
    by_label: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_label[record["label"]].append(record)
    labels = sorted(by_label)
    for key, what in (("class_name", "class names"), ("split", "splits")):
        if key in header:
            _check_one_value(csv_path, by_label, key, what)
    _check_class_sizes(
        {lab: [r["path"] for r in by_label[lab]] for lab in labels},
        {lab: f"label {lab} (line {_lines(by_label[lab])})" for lab in labels},
        f"add rows for these classes or remove their rows from {csv_path}",
    )
    if has_split:
        split_of = {lab: by_label[lab][0]["split"] for lab in labels}
        how = "its split column"
    else:
        train = seeded_train_classes(labels, options["train_fraction"], options["split_seed"])
        split_of = {lab: "train" if lab in train else "test" for lab in labels}
        how = f"train_fraction {options['train_fraction']}, split_seed {options['split_seed']}"
    _check_split_sizes(
        split_of,
        f"{csv_path} ({len(labels)} labels; {how})",
        "add classes, or change the split column or train_fraction",
    )
    listed_at = {r["path"]: f" (listed at {csv_path}:{r['line']})" for r in records}
    _check_images(
        [r["path"] for r in records],
        listed_at,
        options["verify_images"],
        f"Fix these rows of {csv_path} (paths are relative to its folder), or add or replace the files.",
    )
    out = [
        {
            "path": r["path"],
            "label": r["label"],
            "class_name": r.get("class_name", str(r["label"])),
            "split": split_of[r["label"]],
            **({"bbox": r["bbox"]} if "bbox" in r else {}),
        }
        for r in records
    ]
    return _write(out_dir, out, [], csv_path)


def _lines(records: Iterable[Mapping[str, Any]], limit: int = 3) -> str:
    lines = [str(r["line"]) for r in records]
    return ", ".join(lines[:limit]) + (f" and {len(lines) - limit} more" if len(lines) > limit else "")


def _check_one_value(csv_path: Path, by_label: Mapping[int, list[dict[str, Any]]], key: str, what: str) -> None:
    """One ``class_name`` / ``split`` per label: a class in both splits, or under two names, is refused."""
    for label, records in by_label.items():
        first = records[0]
        other = next((r for r in records if r[key] != first[key]), None)
        if other is not None:
            fix = (
                "every image of a class in one split: the benchmark tests on classes never seen in training; "
                "give this label's rows one split"
                if key == "split"
                else "give this label's rows one name"
            )
            raise OwnDatasetError(
                f"{csv_path}:{other['line']}: label {label} has two {what}: {first[key]!r} on "
                f"line {first['line']} and {other[key]!r} on line {other['line']}; {fix}"
            )


# --- the preparer interface --------------------------------------------------------------------------


def prepare(config: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Prepare ``kind: folder`` or ``kind: manifest`` into ``out_dir`` (a new folder: see
    :func:`dmlbench.data.registry.prepare_dataset`).

    Returns:
        The manifest's path.
    """
    kind = config.get("kind")
    if kind == "folder":
        return prepare_folder(config, Path(out_dir))
    if kind == "manifest":
        return prepare_manifest(config, Path(out_dir))
    raise DatasetConfigError(f"dmlbench.data.byo prepares kind 'folder' or 'manifest', not {kind!r}")
