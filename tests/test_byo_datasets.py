"""Your own dataset (issue 30, item 2): ``kind: folder`` (root/<class>/<image>) and ``kind: manifest`` (a CSV
``path,label[,split][,class_name][,bbox]``) prepare to the manifest a hand computation gives, train through the
CLI, plan through Snakemake with one overlay, and every bad input stops ``prepare`` with an error naming the
file / line / folder / key and the fix, leaving no output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import REPO
from PIL import Image

from dmlbench.cli import main
from dmlbench.data.byo import seeded_train_classes
from dmlbench.data.registry import prepare_dataset
from dmlbench.errors import DmlbenchError

PARAMS = str(REPO / "params.yaml")


def image(path: Path, value: int = 0, size: int = 8) -> Path:
    """A small PNG whose pixels are ``value`` (per channel: value, 255 - value, value // 2)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.empty((size, size, 3), np.uint8)
    pixels[...] = (value, 255 - value, value // 2)
    Image.fromarray(pixels).save(path)
    return path


def folder(root: Path, classes: dict[str, int]) -> Path:
    """``root/<class>/<i>.png`` for each class and its number of images."""
    root.mkdir(parents=True, exist_ok=True)
    for k, (name, count) in enumerate(classes.items()):
        for i in range(count):
            image(root / name / f"{i}.png", value=20 * k + i)
    return root


SIX = {c: 2 for c in "abcdef"}


def manifest_rows(path: Path) -> list[tuple[str, int, str, str]]:
    """``(path, label, class_name, split)`` of each row of a prepared manifest."""
    frame = pd.read_csv(path, dtype={"class_name": str}, keep_default_na=False)
    return list(frame[["path", "label", "class_name", "split"]].itertuples(index=False, name=None))


def cli_prepare(tmp_path: Path, section: dict[str, Any], out: Path, name: str = "mine") -> int:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"datasets": {name: {"label": "Mine", "recall_ks": [1, 2], **section}}}))
    return main(["prepare", name, "--out", str(out), "--config", PARAMS, "--config", str(overlay)])


# --- kind: folder ---------------------------------------------------------------------------------


def test_folder_prepares_the_hand_computed_manifest_and_lists_what_it_skipped(tmp_path, capsys):
    root = folder(tmp_path / "imgs", SIX)
    image(root / "b" / "sub" / "deep.JPG")  # sub-folders belong to their class; extension in any case
    (root / "README.txt").write_text("not a class")  # files in the root: skipped
    (root / "a" / "notes.txt").write_text("x")  # another extension: skipped
    (root / "a" / ".DS_Store").write_bytes(b"\0")  # hidden: skipped
    image(root / "c" / "._0.png")  # macOS resource fork (hidden): skipped
    (root / ".cache").mkdir()  # hidden folder: not a class
    out = tmp_path / "out"
    assert cli_prepare(tmp_path, {"kind": "folder", "root": str(root)}, out) == 0
    # classes sorted by name -> labels 0..5; default_rng(0).permutation(6) = [3 2 5 4 0 1]; the first
    # floor(0.5 * 6 + 0.5) = 3 -> d, c, f train; a, b, e test
    split = {"a": "test", "b": "test", "c": "train", "d": "train", "e": "test", "f": "train"}
    expected = [(str(root / c / f"{i}.png"), label, c, split[c]) for label, c in enumerate("abcdef") for i in range(2)]
    expected.insert(4, (str(root / "b" / "sub" / "deep.JPG"), 1, "b", "test"))
    assert manifest_rows(out / "manifest.csv") == expected
    skipped = pd.read_csv(out / "skipped.csv")
    assert list(skipped.itertuples(index=False, name=None)) == [
        (".cache", "hidden"),
        ("README.txt", "not in a class folder"),
        ("a/.DS_Store", "hidden"),
        ("a/notes.txt", "not an image extension"),
        ("c/._0.png", "hidden"),
    ]
    err = capsys.readouterr().err
    assert "skipped 5 file(s)" in err and "skipped.csv" in err
    assert (out / ".dmlbench-prepared").is_file()


def test_the_seeded_rule_is_train_fraction_of_a_seeded_permutation_rounded_half_up(tmp_path):
    # 6 classes, 0.34, seed 1: floor(2.04 + 0.5) = 2 train; default_rng(1).permutation(6) = [4 0 2 1 5 3] -> e, a
    assert seeded_train_classes(list("abcdef"), 0.34, seed=1) == {"e", "a"}
    # 5 classes, 0.5, seed 3: floor(2.5 + 0.5) = 3 train; default_rng(3).permutation(5) = [4 2 1 3 0] -> e, c, b
    assert seeded_train_classes(list("abcde"), 0.5, seed=3) == {"e", "c", "b"}
    root = folder(tmp_path / "imgs", {c: 2 for c in "abcde"})
    prepare_dataset({"kind": "folder", "root": str(root), "train_fraction": 0.5, "split_seed": 3}, tmp_path / "out")
    splits = {c: s for _, _, c, s in manifest_rows(tmp_path / "out" / "manifest.csv")}
    assert splits == {"a": "test", "b": "train", "c": "train", "d": "test", "e": "train"}


def test_the_root_comes_from_the_environment_when_root_is_null(tmp_path, monkeypatch):
    root = folder(tmp_path / "imgs", SIX)
    monkeypatch.setenv("DMLBENCH_FOLDER_ROOT", str(root))
    manifest = prepare_dataset({"kind": "folder", "root": None}, tmp_path / "out")
    assert {p for p, *_ in manifest_rows(manifest)} == {str(root / c / f"{i}.png") for c in "abcdef" for i in (0, 1)}


def test_a_split_file_decides_the_split(tmp_path):
    root = folder(tmp_path / "imgs", {c: 2 for c in "abcd"})
    (root / "splits.csv").write_text("class,split\nd,train\nb,test\na,train\nc,test\n")
    out = tmp_path / "out"
    prepare_dataset({"kind": "folder", "root": str(root), "split_file": "splits.csv"}, out)
    assert {(label, c, s) for _, label, c, s in manifest_rows(out / "manifest.csv")} == {
        (0, "a", "train"),
        (1, "b", "test"),
        (2, "c", "test"),
        (3, "d", "train"),
    }
    assert not (out / "skipped.csv").exists()  # the split file itself is not reported as skipped


# --- kind: manifest -------------------------------------------------------------------------------


def test_manifest_without_split_column_prepares_the_hand_computed_manifest(tmp_path):
    base = tmp_path / "products"
    names = {10: "mug", 3: "cup", 7: "pot", 42: "pan"}
    for label in names:
        for i in range(2):
            image(base / "img" / f"{label}_{i}.png", value=label + i)
    rows = [f"img/{label}_{i}.png,{label},{names[label]},{'1 2 3 4' if i else ''}" for label in names for i in range(2)]
    rows[0] = "./" + rows[0]  # normalised
    csv = base / "list.csv"
    csv.write_text("\ufeffpath, label ,class_name,bbox\r\n" + "\r\n".join(rows) + "\r\n\r\n")  # BOM, CRLF, blanks
    out = tmp_path / "out"
    assert cli_prepare(tmp_path, {"kind": "manifest", "csv": str(csv)}, out) == 0
    # labels sorted [3, 7, 10, 42]; default_rng(0).permutation(4) = [2 0 1 3]; the first 2 -> 10, 3 train
    split = {10: "train", 3: "train", 7: "test", 42: "test"}
    frame = pd.read_csv(out / "manifest.csv", keep_default_na=False)
    assert list(frame["path"]) == [str(base / "img" / f"{label}_{i}.png") for label in names for i in range(2)]
    assert list(frame["label"]) == [10, 10, 3, 3, 7, 7, 42, 42]
    assert list(frame["class_name"]) == [names[label] for label in names for _ in range(2)]
    assert list(frame["split"]) == [split[label] for label in names for _ in range(2)]
    assert list(frame["bbox"]) == ["", "1 2 3 4"] * 4


def test_manifest_split_column_decides_and_class_name_defaults_to_the_label(tmp_path):
    base = tmp_path / "data"
    lines = ["path,label,split"]
    for label, split in ((5, "test"), (1, "train"), (2, "test"), (0, "train")):
        for i in range(2):
            image(base / f"c{label}" / f"{i}.png", value=10 * label + i)
            lines.append(f"c{label}/{i}.png,{label},{split}")
    (base / "list.csv").write_text("\n".join(lines) + "\n")
    manifest = prepare_dataset({"kind": "manifest", "csv": str(base / "list.csv")}, tmp_path / "out")
    assert [(label, name, split) for _, label, name, split in manifest_rows(manifest)][::2] == [
        (5, "5", "test"),
        (1, "1", "train"),
        (2, "2", "test"),
        (0, "0", "train"),
    ]


# --- training and the workflow --------------------------------------------------------------------


def tiny_folder(root: Path, num_classes: int = 12, per_class: int = 4) -> Path:
    """Classes that differ in colour, so that a net has something to learn."""
    rng = np.random.default_rng(0)
    for c in range(num_classes):
        colour = rng.integers(40, 255, size=3)
        for i in range(per_class):
            pixels = rng.integers(0, 60, size=(16, 16, 3)).astype(np.uint8)
            pixels[4:12, 4:12] = colour
            path = root / f"class_{c:02d}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path)
    return root


TINY_TRAINING = {
    "device": "cpu",
    "epochs": 1,
    "val_fraction": 0.34,
    "embedding_dim": 8,
    "eval_batch_size": 16,
    "backbone": {"width": 4, "pretrained": None, "freeze_bn": False},
    "image": {"resize": 16, "test_crop": 12, "train_crop": 12},
    "sampler": {"classes_per_batch": 2, "images_per_class": 2, "batches_per_epoch": 2},
}


def test_a_prepared_folder_trains_one_epoch_embeds_and_evaluates_through_the_cli(tmp_path):
    root = tiny_folder(tmp_path / "imgs")
    overlay = tmp_path / "mine.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "datasets": {
                    "mine": {
                        "kind": "folder",
                        "label": "Mine",
                        "recall_ks": [1, 2],
                        "root": str(root),
                        "training": TINY_TRAINING,
                    }
                }
            }
        )
    )
    config = ["--config", PARAMS, "--config", str(overlay)]
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    assert main(["prepare", "mine", "--out", str(prepared), *config]) == 0
    assert (
        main(
            [
                "train",
                "--dataset",
                "mine",
                "--method",
                "binomial",
                "--seed",
                "0",
                "--no-progress",
                "--manifest",
                str(prepared / "manifest.csv"),
                "--out",
                str(run),
                "--scratch-dir",
                str(tmp_path / "scratch"),
                *config,
            ]
        )
        == 0
    )
    assert len(pd.read_csv(run / "log.csv")) == 1  # one epoch
    assert main(["embed", str(run), "--manifest", str(prepared / "manifest.csv")]) == 0
    assert (
        main(
            ["evaluate", str(run / "embeddings.npz"), "--out", str(run / "metrics.json"), "--dataset", "mine", *config]
        )
        == 0
    )
    metrics = json.loads((run / "metrics.json").read_text())
    # 12 classes: default_rng(0).permutation(12)[:6] = 9 2 7 4 5 11 train; the 6 others x 4 images are the queries
    assert metrics["num_classes"] == 6 and metrics["num_queries"] == 24 and 0 <= metrics["R@1"] <= 1


def snakemake_project(tmp_path: Path) -> tuple[Path, dict[str, str], list[str]]:
    """A copy of the workflow with the overlay ``my.yaml`` (a folder dataset whose root comes from
    ``$DMLBENCH_FOLDER_ROOT``): ``(folder, environment, the snakemake command up to its targets)``."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("Snakefile", "params.yaml"):
        shutil.copy(REPO / name, work / name)
    shutil.copytree(REPO / "workflow", work / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
    folder(tmp_path / "imgs", SIX)
    (work / "my.yaml").write_text(
        yaml.safe_dump(
            {
                "datasets": {
                    "my_birds": {
                        "kind": "folder",
                        "label": "My birds",
                        "recall_ks": [1, 2],
                        "root": None,
                        "training": {**TINY_TRAINING, "val_fraction": 0.0, "selection": "last"},
                    }
                }
            }
        )
    )
    env = {
        **os.environ,
        "DMLBENCH_FOLDER_ROOT": str(tmp_path / "imgs"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    return work, env, [str(Path(sys.executable).parent / "snakemake"), "--cores", "1", "--configfile", "my.yaml"]


def test_snakemake_plans_a_run_on_an_own_dataset_from_one_overlay(tmp_path):
    """The documented command: `snakemake --configfile my.yaml -- results/runs/<name>/binomial/seed0/metrics.json`."""
    work, env, snakemake = snakemake_project(tmp_path)
    plan = subprocess.run(
        [*snakemake, "-n", "--", "results/runs/my_birds/binomial/seed0/metrics.json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", plan.stdout + plan.stderr, flags=re.MULTILINE))
    assert jobs == {"prepare": "1", "train": "1", "embed": "1", "evaluate": "1", "total": "4"}, plan.stdout[-3000:]
    assert "wildcards: dataset=my_birds" in plan.stdout + plan.stderr


@pytest.mark.slow
def test_snakemake_prepares_an_own_dataset(tmp_path):
    work, env, snakemake = snakemake_project(tmp_path)
    done = subprocess.run(
        [*snakemake, "--", "data/prepared/my_birds"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(manifest_rows(work / "data/prepared/my_birds/manifest.csv")) == 12


# --- bad inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A bad dataset: ``build(tmp_path)`` makes the files and returns the params section; the error must
    hold every text of ``says`` (``{root}``, ``{csv}``, ``{tmp}`` filled in)."""

    build: Callable[[Path], dict[str, Any]]
    says: tuple[str, ...]


def csv_data(tmp: Path, rows: list[str], header: str = "path,label", images: int = 4) -> dict[str, Any]:
    """``tmp/data/list.csv`` with ``header`` and ``rows``; images ``img/<label>_<i>.png`` for labels
    0..images-1, ``notes.txt`` beside them, and ``tmp/outside.png``."""
    base = tmp / "data"
    for label in range(images):
        for i in range(2):
            image(base / "img" / f"{label}_{i}.png", value=label * 30 + i)
    (base / "list.csv").write_text("\n".join([header, *rows]) + "\n")
    (base / "notes.txt").write_text("not an image")
    image(tmp / "outside.png")  # outside the CSV's folder: what a `..` path would reach
    return {"kind": "manifest", "csv": str(base / "list.csv")}


#: The 8 rows of a good CSV (lines 2-9): labels 0-3, two images each.
GOOD = [f"img/{label}_{i}.png,{label}" for label in range(4) for i in range(2)]
SPLIT_GOOD = [f"{row},{'train' if int(row[-1]) < 2 else 'test'}" for row in GOOD]


def with_row(line: int, text: str, rows: list[str] = GOOD, header: str = "path,label") -> Callable[[Path], dict]:
    """The good CSV with file line ``line`` (2 = first row) replaced by ``text``."""

    def build(tmp: Path) -> dict[str, Any]:
        new = list(rows)
        new[line - 2] = text
        return csv_data(tmp, new, header)

    return build


def with_rows(rows: list[str], header: str = "path,label", **options: Any) -> Callable[[Path], dict]:
    return lambda tmp: {**csv_data(tmp, rows, header), **options}


def in_folder(
    classes: dict[str, int], edit: Callable[[Path], None] = lambda root: None, **options: Any
) -> Callable[[Path], dict]:
    def build(tmp: Path) -> dict[str, Any]:
        root = folder(tmp / "imgs", classes)
        edit(root)
        return {"kind": "folder", "root": str(root), **options}

    return build


def write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)

    return edit


OUTSIDE = "../outside.png"  # exists (csv_data's folder is tmp/data, the file tmp/outside.png)
SPLIT_FIX = "write train or test"
ESCAPE_FIX = "write paths relative to that folder"
DUPLICATE_FIX = "remove the repeated rows"
LABEL_FIX = "write the class id as digits"
SMALL_FIX = "Retrieval needs at least 2 images per class"

BAD: dict[str, Bad] = {
    # missing root / CSV
    "root_not_configured": Bad(
        lambda tmp: {"kind": "folder", "root": None}, ("no data configured", "`root:`", "DMLBENCH_FOLDER_ROOT")
    ),
    "root_missing": Bad(
        lambda tmp: {"kind": "folder", "root": str(tmp / "nowhere")},
        ("{tmp}/nowhere is not a folder", "DMLBENCH_FOLDER_ROOT"),
    ),
    "root_is_a_file": Bad(
        lambda tmp: {"kind": "folder", "root": str(image(tmp / "one.png"))}, ("{tmp}/one.png is not a folder",)
    ),
    "csv_missing": Bad(
        lambda tmp: {"kind": "manifest", "csv": str(tmp / "none.csv")},
        ("{tmp}/none.csv is not a file", "DMLBENCH_MANIFEST_CSV"),
    ),
    "csv_not_configured": Bad(lambda tmp: {"kind": "manifest"}, ("no data configured", "`csv:`")),
    # empty class folders
    "empty_class_folder": Bad(
        in_folder(SIX, lambda root: (root / "g").mkdir()),
        ("{root}/g/: 0 image(s)", "add images to these folders or move them out of the root"),
    ),
    "class_folder_of_non_images": Bad(
        in_folder(SIX, write("g/readme.md", "text")),
        ("{root}/g/ (skipped: g/readme.md (not an image extension)): 0 image(s)",),
    ),
    "no_class_folder": Bad(
        in_folder({}, write("loose.png", b"x")), ("{root}: no class folders", "root/<class>/<image>")
    ),
    # a class of one image
    "folder_class_of_one_image": Bad(in_folder({**SIX, "g": 1}), ("{root}/g/: 1 image(s)", SMALL_FIX)),
    "csv_class_of_one_image": Bad(with_rows([*GOOD, "img/4_0.png,4"]), ("label 4 (line 10): 1 image(s)", SMALL_FIX)),
    # non-image files: skipped by extension (above); a file with an image extension that is not an image is an error
    "folder_fake_image": Bad(
        in_folder(SIX, write("a/2.jpg", b"not a jpeg")),
        ("{root}/a/2.jpg", "UnidentifiedImageError", "Replace or remove these files"),
    ),
    "csv_fake_image": Bad(
        with_rows([*GOOD, "notes.txt,0"]),  # a listed file is not filtered by extension
        ("{root}/notes.txt", "listed at {csv}:10", "Fix these rows"),
    ),
    "csv_missing_image": Bad(with_row(3, "img/nope.png,0"), ("{root}/img/nope.png: missing", "listed at {csv}:3")),
    # paths leaving the CSV's folder
    "parent_path": Bad(
        with_row(2, f"{OUTSIDE},0"), ("{csv}:2", "'../outside.png' leaves the CSV's folder", ESCAPE_FIX)
    ),
    "absolute_path": Bad(with_row(4, "/etc/passwd,1"), ("{csv}:4", "'/etc/passwd' leaves", ESCAPE_FIX)),
    "climbing_path": Bad(with_row(5, "img/../../outside.png,1"), ("{csv}:5", "leaves", ESCAPE_FIX)),
    "home_path": Bad(with_row(6, "~/x.png,2"), ("{csv}:6", "leaves", ESCAPE_FIX)),
    "empty_path": Bad(with_row(3, ",0"), ("{csv}:3: empty path",)),
    # duplicate rows
    "repeated_row": Bad(
        with_rows([*GOOD, GOOD[2]]), ("{csv}:10", "'img/1_0.png' is listed again (first on line 4)", DUPLICATE_FIX)
    ),
    "repeated_path_written_otherwise": Bad(
        with_rows([*GOOD, "./img//0_1.png,0"]), ("{csv}:10", "listed again (first on line 3)", DUPLICATE_FIX)
    ),
    "repeated_path_other_label": Bad(with_rows([*GOOD, "img/0_0.png,3"]), ("{csv}:10", "listed again", DUPLICATE_FIX)),
    # labels
    "label_text": Bad(
        with_row(3, "img/0_1.png,bird"), ("{csv}:3", "label 'bird' is not a non-negative integer", LABEL_FIX)
    ),
    "label_fraction": Bad(with_row(4, "img/1_0.png,1.0"), ("{csv}:4", "label '1.0'", LABEL_FIX)),
    "label_negative": Bad(with_row(5, "img/1_1.png,-1"), ("{csv}:5", "label '-1'", LABEL_FIX)),
    "label_empty": Bad(with_row(2, "img/0_0.png,"), ("{csv}:2", "label ''", LABEL_FIX)),
    "label_exponent": Bad(with_row(2, "img/0_0.png,1e3"), ("{csv}:2", "label '1e3'", LABEL_FIX)),
    "label_non_ascii_digit": Bad(with_row(2, "img/0_0.png,\uff10"), ("{csv}:2", LABEL_FIX)),
    "label_overflow": Bad(
        with_row(9, "img/3_1.png,9223372036854775808"), ("{csv}:9", "overflows a 64-bit integer", "smaller ids")
    ),
    # split values
    "split_val": Bad(
        with_row(2, "img/0_0.png,0,val", SPLIT_GOOD, "path,label,split"),
        ("{csv}:2", "split 'val' is neither", "training.val_fraction", SPLIT_FIX),
    ),
    "split_validation": Bad(
        with_row(8, "img/3_0.png,3,validation", SPLIT_GOOD, "path,label,split"),
        ("{csv}:8", "OML's 'validation'", SPLIT_FIX),
    ),
    "split_capitalised": Bad(
        with_row(3, "img/0_1.png,0,Train", SPLIT_GOOD, "path,label,split"),
        ("{csv}:3", "did you mean 'train'", SPLIT_FIX),
    ),
    "split_empty": Bad(with_row(4, "img/1_0.png,1,", SPLIT_GOOD, "path,label,split"), ("{csv}:4", "empty", SPLIT_FIX)),
    "split_file_value": Bad(
        in_folder({c: 2 for c in "abcd"}, write("s.csv", "class,split\na,train\nb,gallery\n"), split_file="s.csv"),
        ("{root}/s.csv:3", "split 'gallery'", SPLIT_FIX),
    ),
    # a class in both splits
    "csv_class_in_both_splits": Bad(
        with_row(3, "img/0_1.png,0,test", SPLIT_GOOD, "path,label,split"),
        (
            "{csv}:3",
            "label 0 has two splits: 'train' on line 2 and 'test' on line 3",
            "give this label's rows one split",
        ),
    ),
    "split_file_class_twice": Bad(
        in_folder(
            {c: 2 for c in "abcd"},
            write("s.csv", "class,split\na,train\nb,train\nc,test\nd,test\na,test\n"),
            split_file="s.csv",
        ),
        ("{root}/s.csv:6", "class 'a' is listed again (first on line 2, as train)", "list every class once"),
    ),
    # the rest of the CSV and the split file
    "class_name_twice": Bad(
        with_row(3, "img/0_1.png,0,dog", [f"{r},cat" for r in GOOD], "path,label,class_name"),
        ("{csv}:3", "label 0 has two class names: 'cat' on line 2 and 'dog' on line 3"),
    ),
    "no_label_column": Bad(
        with_rows([r.split(",")[0] for r in GOOD], header="path"),
        ("{csv}:1", "lacks the column(s) ['label']", "path,label,[split]"),
    ),
    "semicolons": Bad(
        with_rows([r.replace(",", ";") for r in GOOD], header="path;label"),
        ("{csv}:1", "lacks the column(s) ['path', 'label']", "comma-separated"),
    ),
    "oml_columns": Bad(
        with_rows([f"{r},True,True" for r in GOOD], header="path,label,is_query,is_gallery"),
        ("{csv}:1", "unknown column(s) ['is_query', 'is_gallery']", "drop those columns"),
    ),
    "repeated_column": Bad(
        with_rows([f"{r},0" for r in GOOD], header="path,label,label"),
        (
            "{csv}:1",
            "['label'] appear more than once",
        ),
    ),
    "short_row": Bad(with_row(6, "img/2_0.png"), ("{csv}:6", "1 cell(s), the header has 2")),
    "not_utf8": Bad(
        lambda tmp: {**csv_data(tmp, GOOD), "csv": str(_latin1(tmp / "data" / "list.csv"))},
        ("{csv}:4", "not UTF-8", "save the file as UTF-8"),
    ),
    "bad_bbox": Bad(
        with_row(5, "img/1_1.png,1,1 2 3", [f"{r}," for r in GOOD], "path,label,bbox"),
        ("{csv}:5", "bbox '1 2 3': not 4 numbers", "'x y w h'"),
    ),
    "split_file_unknown_class": Bad(
        in_folder(
            {c: 2 for c in "abcd"},
            write("s.csv", "class,split\na,train\nb,train\nc,test\nD,test\n"),
            split_file="s.csv",
        ),
        ("{root}/s.csv:5", "'D' is not a class folder"),
    ),
    "split_file_class_unlisted": Bad(
        in_folder(
            {c: 2 for c in "abcd"}, write("s.csv", "class,split\na,train\nb,train\nc,test\n"), split_file="s.csv"
        ),
        ("{root}/s.csv", "['d']", "add a line"),
    ),
    "split_file_missing": Bad(in_folder(SIX, split_file="none.csv"), ("{root}/none.csv is not a file",)),
    # splits too small
    "one_test_class": Bad(
        in_folder({c: 2 for c in "abcd"}, train_fraction=0.7), ("3 train, 1 test class(es)", "change train_fraction")
    ),
    "csv_one_train_class": Bad(
        with_rows([r.replace(",0", ",0,train") if r.endswith(",0") else f"{r},test" for r in GOOD], "path,label,split"),
        ("{csv}", "1 train, 3 test class(es)"),
    ),
    # params
    "unknown_key": Bad(in_folder(SIX, roots="x"), ("unknown params key(s) ['roots']", "did you mean 'root'")),
    "train_fraction_out_of_range": Bad(in_folder(SIX, train_fraction=1.5), ("`train_fraction`", "between 0 and 1")),
    "split_seed_negative": Bad(in_folder(SIX, split_seed=-1), ("`split_seed`", "integer >= 0")),
    "verify_images_word": Bad(in_folder(SIX, verify_images="yes"), ("`verify_images`", "'decode'")),
    "split_file_and_fraction": Bad(
        in_folder(SIX, split_file="s.csv", train_fraction=0.5), ("`split_file` and `train_fraction`", "remove one")
    ),
    "split_column_and_seed": Bad(
        with_rows(SPLIT_GOOD, "path,label,split", split_seed=1), ("has a `split` column", "remove one")
    ),
    "unknown_kind": Bad(lambda tmp: {"kind": "folders", "root": str(tmp)}, ("did you mean 'folder'",)),
}


def _latin1(path: Path) -> Path:
    """Rewrite line 4 of ``path`` with a Latin-1 byte (not UTF-8)."""
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"img/", b"img/\xe9")
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_a_bad_input_is_an_error_naming_where_and_the_fix_and_writes_nothing(case: Bad, tmp_path: Path):
    section = case.build(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(DmlbenchError) as caught:
        prepare_dataset(section, out)
    message = str(caught.value)
    fill = {"root": section.get("root") or tmp_path / "data", "csv": section.get("csv"), "tmp": tmp_path}
    for text in case.says:
        assert text.format(**fill) in message, message
    assert not out.exists()


def test_the_cli_exits_2_with_the_error_and_keeps_an_earlier_prepared_folder(tmp_path, capsys):
    root = folder(tmp_path / "imgs", SIX)
    out = tmp_path / "out"
    assert cli_prepare(tmp_path, {"kind": "folder", "root": str(root)}, out) == 0
    before = (out / "manifest.csv").read_bytes()
    (root / "g").mkdir()
    assert cli_prepare(tmp_path, {"kind": "folder", "root": str(root)}, out) == 2
    assert (
        f"dmlbench prepare: error: 1 class(es) with fewer than 2 images: {root}/g/: 0 image(s)"
        in capsys.readouterr().err
    )
    assert (out / "manifest.csv").read_bytes() == before


@pytest.mark.parametrize("where", ["inside", "same"])
def test_prepare_refuses_an_output_inside_the_image_folder_or_equal_to_the_csv(tmp_path, where):
    root = folder(tmp_path / "imgs", SIX)
    if where == "inside":
        section, out = {"kind": "folder", "root": str(root)}, root / "prepared"
    else:
        section = csv_data(tmp_path, GOOD)
        out = Path(section["csv"])
    with pytest.raises(DmlbenchError, match="is inside the dataset's own files"):
        prepare_dataset(section, out)
    assert not (root / "prepared").exists()


def test_verify_images_false_lets_a_non_image_through_and_decode_catches_a_cut_file(tmp_path):
    root = folder(tmp_path / "imgs", SIX)
    (root / "a" / "2.png").write_bytes(b"not a png")
    manifest = prepare_dataset({"kind": "folder", "root": str(root), "verify_images": False}, tmp_path / "out")
    assert str(root / "a" / "2.png") in {p for p, *_ in manifest_rows(manifest)}
    (root / "a" / "2.png").unlink()
    image(root / "a" / "2.png", size=64)
    data = (root / "a" / "2.png").read_bytes()
    (root / "a" / "2.png").write_bytes(data[: len(data) // 2])  # a valid header, pixel data cut short
    prepare_dataset({"kind": "folder", "root": str(root)}, tmp_path / "headers")  # the default opens headers only
    with pytest.raises(DmlbenchError, match=re.escape(f"{root}/a/2.png")):
        prepare_dataset({"kind": "folder", "root": str(root), "verify_images": "decode"}, tmp_path / "decoded")
