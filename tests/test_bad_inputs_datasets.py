"""Hostile copies of the official datasets (issue "Every bad input a clear error"): every damaged list or
annotation file of Cars196, SOP, In-Shop and VehicleID ends `dmlbench prepare` with exit 2 and a message
naming the file, the line (or annotation) at fault and the fix, and leaves no output; harmless variations
(CRLF, a BOM, blank lines, trailing blanks) give the manifest of the clean copy."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.io
import yaml
from conftest import REPO
from datasets_fakes import FakeCopy, make_cars, make_cub, make_inshop, make_sop, make_vehicleid, snapshot
from PIL import Image

from dmlbench import cli
from dmlbench.cli import main
from dmlbench.params import load_config

MAKERS: dict[str, Callable[[Path], FakeCopy]] = {
    "cars196": make_cars,
    "sop": make_sop,
    "inshop": make_inshop,
    "vehicleid": make_vehicleid,
}
#: The fixes the messages name.
RESTORE = "restore this file from the dataset's official archive"
RESTORE_MAT = "restore cars_annos.mat from the official release"
RESTORE_IMAGES = "Restore these images from the dataset's official archive"
RE_EXTRACT = "re-extract it from the official archive"
SOP_TRAIN, SOP_TEST = "Ebay_train.txt", "Ebay_test.txt"
INSHOP = "list_eval_partition.txt"
VID_TRAIN, VID_TEST = "train_test_split/train_list.txt", "train_test_split/test_list_800.txt"
CARS = "cars_annos.mat"

Edit = Callable[[Path], None]


@dataclass(frozen=True)
class Case:
    """One corruption of a fake copy and what the error must say.

    Attributes:
        kind: the dataset kind.
        edit: corrupts the fake copy, given its root.
        where: text the message must hold: the file and, when a row is at fault, its 1-based line
            (``file:line``) or annotation (``file: annotation N``).
        fix: the fix phrase the message must hold.
        options: extra params keys (e.g. ``verify_images``).
    """

    kind: str
    edit: Edit
    where: str
    fix: str = RESTORE
    options: dict[str, Any] = field(default_factory=dict)


def lines(name: str, edit: Callable[[list[bytes]], list[bytes]]) -> Edit:
    """Rewrite list file ``name`` (relative to the root) through ``edit`` of its lines (no line ends)."""

    def apply(root: Path) -> None:
        path = root / name
        path.write_bytes(b"\n".join(edit(path.read_bytes().split(b"\n"))))

    return apply


def line(name: str, number: int, edit: Callable[[bytes], bytes]) -> Edit:
    """Rewrite 1-based line ``number`` of list file ``name`` through ``edit``."""

    def at(rows: list[bytes]) -> list[bytes]:
        rows[number - 1] = edit(rows[number - 1])
        return rows

    return lines(name, at)


def cell(name: str, number: int, column: int, value: bytes) -> Edit:
    """Set the whitespace-separated cell ``column`` (0-based) of line ``number`` of ``name`` to ``value``."""

    def set_cell(text: bytes) -> bytes:
        cells = text.split()
        cells[column] = value
        return b" ".join(cells)

    return line(name, number, set_cell)


def repeat_line(name: str, number: int, after: int) -> Edit:
    """Insert a copy of line ``number`` after line ``after`` (the copy becomes line ``after + 1``)."""
    return lines(name, lambda rows: rows[:after] + [rows[number - 1]] + rows[after:])


def content(name: str, data: bytes) -> Edit:
    """Replace the whole file ``name`` with ``data``."""
    return lambda root: (root / name).write_bytes(data)


def replace(name: str, old: bytes, new: bytes) -> Edit:
    """Replace every ``old`` in file ``name`` with ``new``."""
    return lambda root: (root / name).write_bytes((root / name).read_bytes().replace(old, new))


def delete(name: str) -> Edit:
    return lambda root: (root / name).unlink()


def truncate_image(name: str) -> Edit:
    """A JPEG whose header is valid and whose pixel data stops short: only decoding finds it."""

    def apply(root: Path) -> None:
        noise = np.random.default_rng(0).integers(0, 256, size=(96, 128, 3), dtype=np.uint8)
        Image.fromarray(noise).save(root / name, format="JPEG", quality=95)
        (root / name).write_bytes((root / name).read_bytes()[:800])

    return apply


def mat(edit: Callable[[dict[str, np.ndarray]], None]) -> Edit:
    """Load ``cars_annos.mat``, apply ``edit`` to its variables, save it again."""

    def apply(root: Path) -> None:
        variables = {k: v for k, v in scipy.io.loadmat(root / CARS).items() if not k.startswith("__")}
        edit(variables)
        scipy.io.savemat(root / CARS, variables)

    return apply


def annotation(index: int, name: str, value: Any) -> Edit:
    """Set field ``name`` of the 1-based annotation ``index`` of ``cars_annos.mat``."""

    def edit(variables: dict[str, np.ndarray]) -> None:
        variables["annotations"][0, index - 1][name] = value

    return mat(edit)


def drop_field(name: str) -> Edit:
    """Remove field ``name`` from every annotation."""

    def edit(variables: dict[str, np.ndarray]) -> None:
        old = variables["annotations"]
        kept = [n for n in old.dtype.names if n != name]
        new = np.empty(old.shape, dtype=[(n, "O") for n in kept])
        for n in kept:
            new[n] = old[n]
        variables["annotations"] = new

    return mat(edit)


def repeat_annotation(variables: dict[str, np.ndarray]) -> None:
    variables["annotations"] = np.concatenate([variables["annotations"], variables["annotations"][:, :1]], axis=1)


def swap_x(variables: dict[str, np.ndarray]) -> None:
    entry = variables["annotations"][0, 2]
    entry["bbox_x1"], entry["bbox_x2"] = entry["bbox_x2"], entry["bbox_x1"]


def list_cases(kind: str, name: str, first_row: int, label_column: int, bad_labels: dict[str, bytes]) -> dict:
    """The corruptions every whitespace-separated list file shares; ``first_row`` = line of its first image."""
    row = first_row + 1  # the corrupted row: the file's second image
    cases = {
        "empty": Case(kind, content(name, b""), f"{Path(name).name}: no rows"),
        "not_utf8": Case(kind, line(name, row, lambda b: b + b"\xe9\xff"), f"{Path(name).name}:{row}: not UTF-8"),
        "missing_column": Case(
            kind, line(name, row, lambda b: b.rsplit(b" ", 1)[0]), f"{Path(name).name}:{row}: expected"
        ),
        "extra_column": Case(kind, line(name, row, lambda b: b + b" extra"), f"{Path(name).name}:{row}: expected"),
        "listed_twice": Case(kind, repeat_line(name, first_row, row + 1), f"{Path(name).name}:{row + 2}: image"),
    }
    for label, value in bad_labels.items():
        cases[f"label_{label}"] = Case(kind, cell(name, row, label_column, value), f"{Path(name).name}:{row}: ")
    return {f"{kind}-{Path(name).stem}-{key}": case for key, case in cases.items()}


SOP_IMAGE = "bicycle_final/111085122801_1.JPG"  # line 3 of Ebay_train.txt
INSHOP_IMAGE = "img/WOMEN/Dresses/id_00000001/02_1_front.jpg"  # line 4
VID_IMAGE = "image/0000101.jpg"  # line 2 of train_list.txt
CARS_IMAGE = "car_ims/000002.jpg"  # annotation 2
NUMBERS = {"word": b"abc", "negative": b"-3", "float": b"3.0"}

CASES: dict[str, Case] = {
    **list_cases("sop", SOP_TRAIN, 2, 1, {**NUMBERS, "zero": b"0"}),
    **list_cases("sop", SOP_TEST, 2, 1, NUMBERS),
    "sop-missing": Case("sop", delete(SOP_TEST), SOP_TEST, "dmlbench download sop"),
    "sop-only_header": Case("sop", lines(SOP_TRAIN, lambda rows: rows[:1]), f"{SOP_TRAIN}: no rows"),
    "sop-no_header": Case("sop", lines(SOP_TRAIN, lambda rows: rows[1:]), f"{SOP_TRAIN}:1: expected the header"),
    "sop-wrong_header": Case(
        "sop", line(SOP_TRAIN, 1, lambda b: b"id class super path"), f"{SOP_TRAIN}:1: expected the header"
    ),
    "sop-super_class_word": Case("sop", cell(SOP_TRAIN, 3, 2, b"x"), f"{SOP_TRAIN}:3: super_class_id"),
    "sop-two_super_classes": Case("sop", cell(SOP_TRAIN, 3, 2, b"7"), f"{SOP_TRAIN}:3 and"),
    "sop-two_folders": Case("sop", cell(SOP_TRAIN, 3, 3, b"chair_final/111085122801_1.JPG"), f"{SOP_TRAIN}:3 and"),
    "sop-two_ids_one_file": Case(
        "sop", cell(SOP_TRAIN, 3, 3, b"bicycle_final/111085122801_0.JPG"), f"{SOP_TRAIN}:3: image"
    ),
    "sop-path_leaves_root": Case("sop", cell(SOP_TRAIN, 3, 3, b"../../etc/passwd"), f"{SOP_TRAIN}:3: image name"),
    "sop-absolute_path": Case("sop", cell(SOP_TRAIN, 3, 3, b"/etc/passwd"), f"{SOP_TRAIN}:3: image name"),
    "sop-class_in_train_and_test": Case(
        "sop", replace(SOP_TEST, b" 5 1 bicycle", b" 1 1 bicycle"), f"in test at {{root}}/{SOP_TEST}:2"
    ),
    "sop-image_missing": Case("sop", delete(SOP_IMAGE), f"listed at {{root}}/{SOP_TRAIN}:3", RESTORE_IMAGES),
    "sop-image_empty": Case(
        "sop", content(SOP_IMAGE, b""), f"listed at {{root}}/{SOP_TRAIN}:3", RESTORE_IMAGES, {"verify_images": True}
    ),
    "sop-image_truncated": Case(
        "sop",
        truncate_image(SOP_IMAGE),
        f"listed at {{root}}/{SOP_TRAIN}:3",
        RESTORE_IMAGES,
        {"verify_images": "decode"},
    ),
    **list_cases(
        "inshop", INSHOP, 3, 1, {"word": b"abc", "negative": b"id_-3", "float": b"id_3.0", "zero": b"id_00000000"}
    ),
    # a repeated row also breaks the count on line 1, which is checked first
    "inshop-list_eval_partition-listed_twice": Case(
        "inshop", repeat_line(INSHOP, 3, 5), f"{INSHOP}: first line says '20' images, the file lists 21"
    ),
    "inshop-missing": Case("inshop", delete(INSHOP), INSHOP, "dmlbench download inshop"),
    "inshop-only_header": Case("inshop", lines(INSHOP, lambda rows: rows[:2]), f"{INSHOP}: no rows"),
    "inshop-count_word": Case("inshop", line(INSHOP, 1, lambda b: b"many"), f"{INSHOP}:1: expected the number"),
    "inshop-no_count": Case("inshop", lines(INSHOP, lambda rows: rows[1:]), f"{INSHOP}:1: expected the number"),
    "inshop-count_wrong": Case("inshop", line(INSHOP, 1, lambda b: b"999"), f"{INSHOP}: first line says '999'"),
    "inshop-wrong_header": Case("inshop", line(INSHOP, 2, lambda b: b"a b c"), f"{INSHOP}:2: expected the header"),
    "inshop-bad_status": Case("inshop", cell(INSHOP, 4, 2, b"val"), f"{INSHOP}:4: "),
    "inshop-path_leaves_root": Case("inshop", cell(INSHOP, 4, 0, b"../../etc/passwd"), f"{INSHOP}:4: image name"),
    "inshop-two_rows_one_file": Case(
        "inshop", cell(INSHOP, 4, 0, b"img/WOMEN/Dresses/id_00000001/01_1_front.jpg"), f"{INSHOP}:4: image"
    ),
    "inshop-item_in_train_and_query": Case(
        "inshop", replace(INSHOP, b" id_00000005 ", b" id_00000001 "), f"in query at {{root}}/{INSHOP}:11"
    ),
    "inshop-image_missing": Case("inshop", delete(INSHOP_IMAGE), f"listed at {{root}}/{INSHOP}:4", RESTORE_IMAGES),
    **list_cases("vehicleid", VID_TRAIN, 1, 1, NUMBERS),
    **list_cases("vehicleid", VID_TEST, 1, 1, NUMBERS),
    "vehicleid-missing": Case("vehicleid", delete(VID_TRAIN), "train_list.txt", "dmlbench download vehicleid"),
    "vehicleid-path_leaves_root": Case(
        "vehicleid", cell(VID_TRAIN, 2, 0, b"../../../etc/x"), "train_list.txt:2: image name"
    ),
    "vehicleid-one_image_two_vehicles": Case(
        "vehicleid",  # a train image of vehicle 1 in the test list too
        lines(VID_TEST, lambda rows: [rows[0], b"0000100 10", *rows[1:]]),
        "test_list_800.txt:2: image",
    ),
    "vehicleid-vehicle_in_train_and_test": Case(
        "vehicleid", replace(VID_TEST, b" 10\n", b" 1\n"), "in test at {root}/" + VID_TEST + ":1"
    ),
    "vehicleid-image_missing": Case(
        "vehicleid", delete(VID_IMAGE), f"listed at {{root}}/{VID_TRAIN}:2", RESTORE_IMAGES
    ),
    "cars196-missing": Case("cars196", delete(CARS), CARS, "dmlbench download cars196"),
    "cars196-empty": Case("cars196", content(CARS, b""), f"{CARS}: cannot read", RESTORE_MAT),
    "cars196-garbage": Case("cars196", content(CARS, b"not a MATLAB file " * 20), f"{CARS}: cannot read", RESTORE_MAT),
    "cars196-truncated": Case(
        "cars196",
        lambda root: (root / CARS).write_bytes((root / CARS).read_bytes()[:400]),
        f"{CARS}: cannot read",
        RESTORE_MAT,
    ),
    "cars196-no_annotations": Case("cars196", mat(lambda v: v.pop("annotations")), f"{CARS}: no variable", RESTORE_MAT),
    "cars196-no_class_names": Case("cars196", mat(lambda v: v.pop("class_names")), f"{CARS}: no variable", RESTORE_MAT),
    "cars196-no_class_field": Case("cars196", drop_field("class"), f"{CARS}: annotations lack", RESTORE_MAT),
    "cars196-no_box_field": Case("cars196", drop_field("bbox_x2"), f"{CARS}: annotations lack", RESTORE_MAT),
    "cars196-annotations_not_a_struct": Case(
        "cars196",
        mat(lambda v: v.__setitem__("annotations", np.zeros((1, 3)))),
        f"{CARS}: annotations lack",
        RESTORE_MAT,
    ),
    "cars196-class_names_numbers": Case(
        "cars196", mat(lambda v: v.__setitem__("class_names", np.arange(196.0))), f"{CARS}: class_names", RESTORE_MAT
    ),
    "cars196-class_word": Case(
        "cars196", annotation(3, "class", np.array(["abc"])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_zero": Case(
        "cars196", annotation(3, "class", np.array([[0]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_negative": Case(
        "cars196", annotation(3, "class", np.array([[-3]], dtype=np.int16)), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_197": Case(
        "cars196", annotation(3, "class", np.array([[197]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_fraction": Case(
        "cars196", annotation(3, "class", np.array([[2.5]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_empty": Case(
        "cars196", annotation(3, "class", np.zeros((0, 0))), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-class_two_values": Case(
        "cars196", annotation(3, "class", np.array([[1, 2]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-box_nan": Case(
        "cars196", annotation(3, "bbox_x1", np.array([[np.nan]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-box_word": Case(
        "cars196", annotation(3, "bbox_y1", np.array(["x"])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-box_inverted": Case("cars196", mat(swap_x), f"{CARS}: annotation 3", RESTORE_MAT),
    "cars196-path_number": Case(
        "cars196", annotation(3, "relative_im_path", np.array([[5]])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-path_empty": Case(
        "cars196", annotation(3, "relative_im_path", np.array([""])), f"{CARS}: annotation 3", RESTORE_MAT
    ),
    "cars196-path_leaves_root": Case(
        "cars196",
        annotation(3, "relative_im_path", np.array(["../../etc/passwd"])),
        f"{CARS}: annotation 3: image name",
    ),
    "cars196-two_annotations_one_file": Case(
        "cars196", annotation(4, "relative_im_path", np.array(["car_ims/000001.jpg"])), f"{CARS}: annotation 4: image"
    ),
    "cars196-annotation_twice": Case("cars196", mat(repeat_annotation), f"{CARS}: annotation 19: image"),
    "cars196-no_annotations_left": Case(
        "cars196", mat(lambda v: v.__setitem__("annotations", v["annotations"][:, :0])), CARS, RE_EXTRACT
    ),
    "cars196-image_missing": Case(
        "cars196", delete(CARS_IMAGE), f"listed at {{root}}/{CARS}: annotation 2", RESTORE_IMAGES
    ),
    "cars196-image_truncated": Case(
        "cars196", truncate_image(CARS_IMAGE), f"listed at {{root}}/{CARS}: annotation 2", RESTORE_IMAGES
    ),
}


_CONFIGS: dict[tuple[bytes, ...], dict] = {}


def _config_read_once(paths: Sequence[str]) -> dict:
    """:func:`dmlbench.params.load_config`, parsed once per content of the files (~60 ms each time saved)."""
    key = tuple(Path(p).read_bytes() for p in paths)
    if key not in _CONFIGS:
        _CONFIGS[key] = load_config(paths)
    return copy.deepcopy(_CONFIGS[key])


@pytest.fixture(autouse=True)
def _params_read_once(monkeypatch):
    """Every case reads params.yaml and one of a few overlays: the CLI parses each combination once."""
    monkeypatch.setattr(cli, "load_config", _config_read_once)


def prepare(fake: FakeCopy, kind: str, out: Path, monkeypatch: pytest.MonkeyPatch, **options: Any) -> int:
    """``dmlbench prepare`` of ``fake`` through the CLI: a params overlay names it ``fake``; its root comes
    from ``$DMLBENCH_<KIND>_ROOT``, so that the overlay is the same for every copy of a kind."""
    monkeypatch.setenv(f"DMLBENCH_{kind.upper()}_ROOT", str(fake.root))
    overlay = out.parent / "overlay.yaml"
    section = fake.config(kind, root=None, label="Fake", recall_ks=[1], **options)
    overlay.write_text(yaml.safe_dump({"datasets": {"fake": section}}))
    return main(["prepare", "fake", "--out", str(out), "--config", str(REPO / "params.yaml"), "--config", str(overlay)])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_damaged_copy_exits_2_naming_file_row_and_fix_and_writes_nothing(
    case: Case, tmp_path: Path, capsys, monkeypatch
):
    fake = MAKERS[case.kind](tmp_path / "raw")
    case.edit(fake.root)
    out = tmp_path / "out"
    assert prepare(fake, case.kind, out, monkeypatch, **case.options) == 2
    err = capsys.readouterr().err
    assert err.startswith("dmlbench prepare: error: ") and "Traceback" not in err
    assert case.where.format(root=fake.root) in err, err
    assert case.fix in err, err
    assert not out.exists()


def test_a_failing_prepare_leaves_an_earlier_prepared_folder_as_it_was(tmp_path: Path, capsys, monkeypatch):
    """SOP writes super_classes.csv next to the manifest: a failed re-prepare must change neither."""
    fake = make_sop(tmp_path / "raw")
    out = tmp_path / "out"
    assert prepare(fake, "sop", out, monkeypatch) == 0
    before = snapshot(out)
    cell(SOP_TEST, 3, 2, b"9")(fake.root)  # class 5's second image under another super class
    assert prepare(fake, "sop", out, monkeypatch) == 2
    assert (
        f"class 5 has super_class_id 9 and 1, folder 'bicycle' and 'bicycle' ({fake.root / SOP_TEST}:3"
        in capsys.readouterr().err
    )
    assert snapshot(out) == before


def test_a_failing_crop_leaves_no_output_folder(tmp_path: Path, capsys, monkeypatch):
    """Cropping runs after the checks; a crop that cannot be decoded must not leave an empty folder."""
    fake = make_cars(tmp_path / "raw")
    truncate_image(CARS_IMAGE)(fake.root)
    out = tmp_path / "out"
    assert prepare(fake, "cars196", out, monkeypatch, cropped=True, verify_images=False) == 2
    assert CARS_IMAGE in capsys.readouterr().err
    assert not out.exists()


#: Harmless variations of a list file that must give the clean copy's manifest.
VARIATIONS: dict[str, Callable[[bytes], bytes]] = {
    "crlf": lambda b: b.replace(b"\n", b"\r\n"),
    "bom": lambda b: b"\xef\xbb\xbf" + b,
    "blank_lines": lambda b: b.replace(b"\n", b"\n\n", 2) + b"\n \n",
    "trailing_blanks": lambda b: b.replace(b"\n", b" \t\n"),
    "no_final_newline": lambda b: b.rstrip(b"\n"),
}
LIST_FILES = {"sop": [SOP_TRAIN, SOP_TEST], "inshop": [INSHOP], "vehicleid": [VID_TRAIN, VID_TEST]}


@pytest.fixture(scope="module")
def clean_manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """``{kind: manifest of the clean fake}`` with the fake's root written as ``<root>``."""
    manifests = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for kind in LIST_FILES:
            tmp = tmp_path_factory.mktemp(kind)
            fake = MAKERS[kind](tmp / "raw")
            assert prepare(fake, kind, tmp / "out", monkeypatch) == 0
            manifests[kind] = (tmp / "out" / "manifest.csv").read_bytes().replace(bytes(fake.root), b"<root>")
    return manifests


@pytest.mark.parametrize("variation", VARIATIONS)
@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, names in LIST_FILES.items() for n in names])
def test_harmless_variations_of_a_list_file_give_the_same_manifest(
    kind: str, name: str, variation: str, clean_manifests: dict[str, bytes], tmp_path: Path, monkeypatch
):
    fake = MAKERS[kind](tmp_path / "raw")
    path = fake.root / name
    path.write_bytes(VARIATIONS[variation](path.read_bytes()))
    assert prepare(fake, kind, tmp_path / "out", monkeypatch) == 0
    manifest = (tmp_path / "out" / "manifest.csv").read_bytes()
    assert manifest.replace(bytes(fake.root), b"<root>") == clean_manifests[kind]


# --- prepare never deletes or overwrites what it does not own (issue 28, data loss) ---------------------------

SYNTHETIC = {
    "kind": "synthetic",
    "recall_ks": [1],
    "num_classes": 4,
    "images_per_class": 2,
    "image_size": 32,
    "classes_per_family": 2,
    "seed": 0,
}


@pytest.mark.parametrize("files", [["images/mine.png"], ["notes.txt"], ["images/"], [".hidden"], ["a/b/c.jpg"]])
def test_prepare_refuses_a_non_empty_folder_it_did_not_make(tmp_path: Path, capsys, files: list[str]):
    """`prepare synthetic --out DIR` used to delete DIR/images/; now a folder without the marker is left as is."""
    out = tmp_path / "out"
    for name in files:
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        if not name.endswith("/"):
            path.rmdir()
            path.write_bytes(b"mine")
    before = snapshot(out)
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump({"datasets": {"synthetic": SYNTHETIC}}))
    assert (
        main(
            [
                "prepare",
                "synthetic",
                "--out",
                str(out),
                "--config",
                str(REPO / "params.yaml"),
                "--config",
                str(tmp_path / "overlay.yaml"),
            ]
        )
        == 2
    )
    assert "not made by dmlbench prepare" in capsys.readouterr().err and snapshot(out) == before


def test_prepare_rewrites_its_own_folder_and_an_empty_one(tmp_path: Path):
    from dmlbench.data.registry import OWNER_MARKER, prepare_dataset

    out = tmp_path / "out"
    out.mkdir()
    prepare_dataset(SYNTHETIC, out)
    assert (out / OWNER_MARKER).is_file()
    prepare_dataset({**SYNTHETIC, "num_classes": 6}, out)  # its own folder: rewritten
    assert len(list((out / "images").iterdir())) == 6


@pytest.mark.parametrize("inside", [".", "images", "images/001.Bird_1", "new/deeper"])
def test_prepare_never_writes_into_the_datasets_own_copy(tmp_path: Path, capsys, inside: str):
    """`prepare cub200_cropped --out <the copy's root>` replaced the source images with their crops."""
    from dmlbench.data.registry import OutputFolderError, prepare_dataset

    fake = make_cub(tmp_path)
    before = snapshot(fake.root)
    with pytest.raises(OutputFolderError, match="inside the dataset's own files"):
        prepare_dataset(fake.config("cub200", cropped=True), fake.root / inside)
    assert snapshot(fake.root) == before
