"""Hostile inputs and faults end in a clear error (exit 2, naming the key or file and the fix) and
leave no output behind; issue "Every bad input a clear error" grows this corpus."""

from __future__ import annotations

import hashlib
import io
import math
import re
import shlex
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, tiny_run, write_tiny_dataset
from datasets_fakes import make_cub
from PIL import Image

from dmlbench.atomic import atomic_output
from dmlbench.cli import main
from dmlbench.config import ConfigError
from dmlbench.data import cub200
from dmlbench.data.archives import DamagedArchiveError, extract_archive
from dmlbench.data.download import Archive, DownloadError, extract_archives
from dmlbench.data.images import ImageCheckError, load_rgb, unreadable_images
from dmlbench.data.kinds import PREPARER_MODULES
from dmlbench.data.manifest import ManifestError, read_manifest
from dmlbench.data.official import DatasetConfigError
from dmlbench.errors import DmlbenchError
from dmlbench.methods.validation import check_planned_methods
from dmlbench.params import load_config
from dmlbench.training.data import load_run_data
from dmlbench.training.trainer import NonFiniteLossError, NonFiniteWeightsError, Trainer, non_finite_tensors

TINY_TRAINING = {
    "epochs": 2,
    "val_fraction": 0.34,
    "device": "cpu",
    "embedding_dim": 8,
    "eval_batch_size": 16,
    "backbone": {"width": 4, "pretrained": None, "freeze_bn": False},
    "image": {"resize": 24, "test_crop": 20, "train_crop": 20},
    "sampler": {"classes_per_batch": 3, "images_per_class": 3, "batches_per_epoch": 2},
}


def _train(tmp_path: Path, overlay: dict, method: str = "triplet") -> tuple[int, Path]:
    manifest = write_tiny_dataset(tmp_path / "tiny", num_classes=12)
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay))
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            method,
            "--seed",
            "0",
            "--manifest",
            str(manifest),
            "--out",
            str(out),
            "--scratch-dir",
            str(tmp_path / "scratch"),
            "--no-progress",
            "--config",
            str(REPO / "params.yaml"),
            "--config",
            str(path),
        ]
    )
    return code, out


def test_an_infinite_batchnorm_statistic_stops_the_run_though_the_loss_is_finite(
    params: dict, tiny_manifest: Path, tmp_path: Path
):
    """BatchNorm in train mode normalises with the batch's statistics, so the loss stays finite while
    an infinite running variance (what lr 1e8 gave on the embedded default) poisons every later
    evaluation: the weights check names the buffer, and nothing is saved."""
    run = tiny_run(params, epochs=2)
    run["training"]["backbone"]["freeze_bn"] = False
    trainer = Trainer(
        run,
        load_run_data(run, tiny_manifest),
        tmp_path / "run",
        tmp_path / "scratch",
        torch.device("cpu"),
        progress=False,
    )
    bn = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn.running_var.fill_(math.inf)
    with pytest.raises(NonFiniteWeightsError, match=r"diverged in epoch 1: backbone\.body\..*running_var"):
        trainer.fit()
    assert not (tmp_path / "run").exists() and not (tmp_path / "scratch" / "last.pt").exists()


def test_non_finite_tensors_lists_parameters_and_buffers_by_name():
    module = torch.nn.BatchNorm1d(2)
    assert non_finite_tensors(module) == []
    module.weight.data[0] = math.nan
    module.running_var[1] = -math.inf
    assert non_finite_tensors(module) == ["weight", "running_var"]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", ["training.optimizer.lr", "methods.triplet.loss.margin"])
def test_non_finite_parameters_name_the_key(tmp_path: Path, key: str, value: str):
    overlay = tmp_path / "o.yaml"
    *parents, leaf = key.split(".")
    text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents)) + f"{'  ' * len(parents)}{leaf}: {value}\n"
    overlay.write_text(text)
    with pytest.raises(ConfigError, match=f"{key.replace('.', '[.]')} = -?(nan|inf).*Write a number"):
        load_config([REPO / "params.yaml", overlay])


@pytest.mark.parametrize("lr", [1.0e8, 1.0e38])
def test_a_learning_rate_beyond_the_schema_bound_is_a_config_error(tmp_path: Path, capsys, lr: float):
    """lr 1e8 diverged the embedded default into an infinite BatchNorm variance and lr 1e38 overflowed
    Adam's step arithmetic (a traceback): both are refused when the parameters are read."""
    code, out = _train(tmp_path, {"training": {**TINY_TRAINING, "optimizer": {"lr": lr}}})
    assert code == 2 and "training.optimizer.lr" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["evaluate", "x.npz", "--out", "m.json", "--threads", "-1"],
            "--threads: expects an integer >= 1 (CPU threads)",
        ),
        (["evaluate", "x.npz", "--out", "m.json", "--threads", "two"], "--threads: expects an integer (CPU threads)"),
        (["evaluate", "x.npz", "--out", "m.json", "--kmeans-niter", "0"], "--kmeans-niter: expects an integer >= 1"),
        (["evaluate", "x.npz", "--out", "m.json", "--kmeans-nredo", "0"], "--kmeans-nredo: expects an integer >= 1"),
        (["evaluate", "x.npz", "--out", "m.json", "--chunk-size", "0"], "--chunk-size: expects an integer >= 1"),
        (["train", "--dataset", "synthetic", "--method", "triplet", "--seed", "-1"], "--seed: expects an integer >= 0"),
        (["info", "backbones", "--image-size", "0"], "--image-size: expects an integer >= 8"),
    ],
)
def test_numeric_options_are_checked_by_the_parser(argv: list[str], message: str, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("error", [NonFiniteLossError, NonFiniteWeightsError, ConfigError])
def test_project_errors_share_one_base_and_keep_their_builtin(error: type[Exception]):
    assert issubclass(error, DmlbenchError)
    assert issubclass(error, (ValueError, RuntimeError))


def _manifest_with(tmp_path: Path, edit) -> Path:
    """The tiny dataset's manifest after ``edit(frame) -> frame``."""
    manifest = write_tiny_dataset(tmp_path / "tiny", num_classes=4, per_class=3)
    frame = pd.read_csv(manifest, dtype=str, keep_default_na=False)
    edit(frame).to_csv(manifest, index=False)
    return manifest


@pytest.mark.parametrize("split", ["test", "train"])
def test_a_repeated_image_in_the_manifest_names_the_path_and_lines(tmp_path: Path, split: str):
    """A test image listed twice is its own nearest neighbour and inflates R@1 silently."""

    def repeat(frame: pd.DataFrame) -> pd.DataFrame:
        row = frame[frame["split"] == split].iloc[[0]]
        return pd.concat([frame, row], ignore_index=True)

    manifest = _manifest_with(tmp_path, repeat)
    n = len(pd.read_csv(manifest))
    with pytest.raises(ManifestError, match=rf"appear more than once.*on lines \d+, {n + 1}.*re-run `dmlbench prepare"):
        read_manifest(manifest)


def test_an_empty_path_cell_names_its_line(tmp_path: Path):
    def blank(frame: pd.DataFrame) -> pd.DataFrame:
        frame.loc[2, "path"] = ""
        return frame

    with pytest.raises(ManifestError, match=r"empty 'path' on line\(s\) 4 \(of 1\)"):
        read_manifest(_manifest_with(tmp_path, blank))


@pytest.mark.parametrize("content", ["garbage", "npy", "float_labels", "one_class", "huge", "partial_slices"])
def test_bad_embeddings_files_exit_2_naming_the_file(tmp_path: Path, capsys, content: str):
    """Each of these once ended in a traceback, a faiss abort (exit 134) or silently perfect scores."""
    path = tmp_path / "e.npz"
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(8, 4)).astype(np.float32)
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    expected = {
        "garbage": "not a readable .npz",
        "npy": "single array (.npy)",
        "float_labels": "labels must be integers",
        "one_class": "single class",
        "huge": "squared distances overflow",
        "partial_slices": "cover 3 of the 4",
    }[content]
    if content == "garbage":
        path.write_bytes(b"PK\x03\x04 not really a zip")
    elif content == "npy":
        with open(path, "wb") as stream:
            np.save(stream, embeddings)
    else:
        arrays = {"embeddings": embeddings, "labels": labels}
        if content == "float_labels":
            arrays["labels"] = labels.astype(np.float32)
        elif content == "one_class":
            arrays["labels"] = np.zeros(8, dtype=np.int64)
        elif content == "huge":
            arrays["embeddings"] = embeddings * 1e20
        else:
            arrays["learner_slices"] = np.array([[0, 2], [2, 3]])
        np.savez(path, **arrays)
    out = tmp_path / "m.json"
    assert main(["evaluate", str(path), "--out", str(out), "--recall-ks", "1"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and expected in err
    assert not out.exists()


def test_an_archive_placed_by_hand_with_the_wrong_checksum_is_not_extracted(tmp_path: Path, monkeypatch):
    """``download: true`` (and ``prepare`` of a raw folder) extracts what lies in raw/<kind>/: a file
    that is not the pinned archive must be refused, naming both digests, with nothing extracted."""
    blob = io.BytesIO()
    with tarfile.open(fileobj=blob, mode="w:gz") as archive:
        info = tarfile.TarInfo("Data/list.txt")
        info.size = 4
        archive.addfile(info, io.BytesIO(b"1 a\n"))
    module = types.ModuleType("fakeset_bad_inputs")
    module.INFO, module.ARCHIVE_ROOT = cub200.INFO, "Data"
    module.ARCHIVES = [Archive("data.tgz", "0" * 64, ["https://example.invalid/data.tgz"])]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(PREPARER_MODULES, "fakeset", module.__name__)
    raw = tmp_path / "raw" / "fakeset"
    raw.mkdir(parents=True)
    (raw / "data.tgz").write_bytes(blob.getvalue())
    found = hashlib.sha256(blob.getvalue()).hexdigest()
    with pytest.raises(DownloadError, match=rf"data.tgz: sha256 mismatch: expected 0{{64}}, found {found}.*Delete it"):
        extract_archives("fakeset", tmp_path / "raw")
    assert not (raw / "extracted" / "Data").exists()


def test_a_16_bit_png_is_scaled_not_clipped_to_white(tmp_path: Path):
    """PIL's convert('RGB') clips I;16 to 255: every pixel above 255/65535 of full scale came back white."""
    ramp = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 257).astype(np.uint16)  # 0 … 65,535
    path = tmp_path / "ramp16.png"
    Image.fromarray(ramp).save(path)
    assert Image.open(path).mode.startswith("I")
    rgb = np.asarray(load_rgb(path))
    assert rgb.shape == (16, 16, 3) and (rgb[..., 0] == rgb[..., 2]).all()
    np.testing.assert_array_equal(rgb[..., 0].ravel(), np.round(np.arange(256) * 257 / 65535 * 255))


def test_an_overlay_path_with_a_space_reaches_the_job_as_one_argument(tmp_path: Path):
    overlay = tmp_path / "my overlays" / "it's.yaml"
    overlay.parent.mkdir()
    overlay.write_text("seeds: [0]\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--forceall",
            "results/runs/synthetic/margin/seed0/log.csv",
            "--configfile",
            str(overlay),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    command = next(line for line in out.stdout.splitlines() if "dmlbench train" in line)
    arguments = shlex.split(command.split(">")[0])
    assert arguments[arguments.index(str(overlay)) - 1] == "--config"


def test_a_killed_writer_leaves_an_orphan_that_the_next_write_sweeps(tmp_path: Path):
    """A writer killed between its temporary file and the rename leaves the temporary file; the next
    write of the same target removes it (a dead pid of this host), a live writer's file stays."""
    target = tmp_path / "checkpoint.pt"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, sys; from dmlbench.atomic import atomic_output\n"
                f"with atomic_output({str(target)!r}) as tmp:\n"
                "    tmp.write_bytes(b'x' * 1000); print(tmp, flush=True); os._exit(9)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    orphan = Path(child.stdout.readline().strip())
    assert child.wait() == 9 and orphan.is_file() and not target.exists()
    with atomic_output(target) as tmp:
        live = list(tmp_path.glob(".checkpoint.pt.*"))
        tmp.write_bytes(b"new")
    assert not orphan.exists() and target.read_bytes() == b"new"
    assert live == [tmp] and not list(tmp_path.glob(".checkpoint.pt.*"))


def test_a_corrupt_resume_checkpoint_says_to_delete_it(tmp_path: Path, capsys):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "last.pt").write_bytes(b"\x80\x02 truncated")
    code, out = _train(tmp_path, {"training": {**TINY_TRAINING, "optimizer": {"lr": 1.0e-3}}})
    err = capsys.readouterr().err
    assert code == 2 and f"{scratch / 'last.pt'}: not a readable dmlbench checkpoint" in err
    assert "delete it to train the run from its first epoch" in err and not out.exists()


def test_a_checkpoint_with_missing_weights_names_the_file_at_embed(tmp_path: Path, capsys):
    code, out = _train(tmp_path, {"training": {**TINY_TRAINING, "epochs": 1, "optimizer": {"lr": 1.0e-3}}})
    assert code == 0
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    checkpoint["model"].pop(next(iter(checkpoint["model"])))
    torch.save(checkpoint, out / "checkpoint.pt")
    embeddings = out / "embeddings.npz"
    manifest = tmp_path / "tiny" / "manifest.csv"
    assert main(["embed", str(out), "--manifest", str(manifest), "--out", str(embeddings)]) == 2
    err = capsys.readouterr().err
    assert f"{out / 'checkpoint.pt'}: its weights do not fit triplet's model" in err and "Missing key" in err
    assert not embeddings.exists()


@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        ({"methods": {"triplet": {"loss": {"name": "triplett"}}}}, "methods.triplet on synthetic: .*triplett"),
        ({"methods": {"triplet": {"loss": {"margn": 0.2}}}}, "methods.triplet on synthetic: .*margn"),
        ({"methods": {"triplet": {"recipe": "baseline2"}}}, "methods.triplet on synthetic: .*baseline2.*unknown"),
        (
            {"methods": {"abe8": {"options": {"learners": 3}}}},
            "methods.abe8 on synthetic: .*not divisible.*learners = 3",
        ),
        ({"methods": {"abe8": {"options": {"learnrs": 8}}}}, "methods.abe8 on synthetic: .*learnrs"),
        ({"training": {"backbone": {"name": "resnet5O"}}}, "on synthetic: .*resnet5O.*unknown"),
    ],
)
def test_planned_methods_are_checked_before_any_job(tmp_path: Path, overlay: dict, message: str):
    """Each of these used to fail only inside its train job, after `snakemake -n` had passed."""
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay))
    config = load_config([REPO / "params.yaml", path])
    with pytest.raises(ConfigError, match=message):
        check_planned_methods(config)


def test_snakemake_dry_run_runs_the_method_checks(tmp_path: Path):
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump({"methods": {"abe8": {"options": {"learners": 3}}}}))
    out = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "results/tables/table1.tex", "--configfile", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "methods.abe8 on synthetic" in out.stdout + out.stderr


def test_the_shipped_configurations_pass_the_method_checks():
    overlays = REPO / "workflow" / "overlays"
    for extra in ([], [overlays / "cub_lite.yaml"], [overlays / "paper.yaml"]):
        check_planned_methods(load_config([REPO / "params.yaml", *extra]))


def _broken_cub(tmp_path: Path, name: str, edit) -> tuple[dict, Path]:
    fake = make_cub(tmp_path / "raw")
    path = fake.root / name
    path.write_bytes(edit(path.read_bytes()))
    return fake.config("cub200"), tmp_path / "out"


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        (
            "images.txt",
            lambda b: b.replace(b"\n", b"\xe9\xff\n", 1),
            r"images.txt:1: not UTF-8 text.*restore this file",
        ),
        (
            "bounding_boxes.txt",
            lambda b: b.replace(b"\n", b"x\n", 1),
            r"bounding_boxes.txt:1: expected numbers, found .*restore this file",
        ),
        ("bounding_boxes.txt", lambda b: b"1 nan 1 2 3\n" + b.split(b"\n", 1)[1], r"bounding_boxes.txt:1: non-finite"),
        (
            "bounding_boxes.txt",
            lambda b: b"1 0 0 0 5\n" + b.split(b"\n", 1)[1],
            r"bounding_boxes.txt:1: box width and height must be positive",
        ),
        (
            "bounding_boxes.txt",
            lambda b: b.split(b"\n", 1)[1],
            r"bounding_boxes.txt: no entry for image id 1 \(.*images.txt:1\)",
        ),
        (
            "bounding_boxes.txt",
            lambda b: b.replace(b"\n", b" 7\n", 1),
            r"bounding_boxes.txt:1: expected 5 columns, found 6",
        ),
        (
            "images.txt",
            lambda b: b + b.split(b"\n")[0].replace(b"1 ", b"99 ", 1) + b"\n",
            r"images.txt:\d+: image .*jpg is listed again, under id 99 \(first under id 1\)",
        ),
        (
            "images.txt",
            lambda b: b + b.split(b"\n")[1] + b"\n",
            r"images.txt:\d+: image id 2 is listed again \(first on line 2\)",
        ),
        (
            "image_class_labels.txt",
            lambda b: b"1 1.5\n" + b.split(b"\n", 1)[1],
            r"image_class_labels.txt:1: class_id must be an integer >= 1, found '1.5'",
        ),
        (
            "image_class_labels.txt",
            lambda b: b"1 777\n" + b.split(b"\n", 1)[1],
            r"image_class_labels.txt:1: class 777 is not in .*classes.txt",
        ),
        ("classes.txt", lambda b: b + b.split(b"\n")[0] + b"\n", r"classes.txt:\d+: class id 1 is listed again"),
        ("classes.txt", lambda b: b"", r"classes.txt: no rows \(the file is empty\)"),
    ],
)
def test_broken_cub_list_files_name_the_file_row_and_fix(tmp_path: Path, name: str, edit, message: str):
    config, out = _broken_cub(tmp_path, name, edit)
    with pytest.raises(ManifestError, match=message):
        cub200.prepare(config, out)
    assert not (out / "manifest.csv").exists()


def test_a_jpeg_cut_short_behind_a_valid_header_is_found_by_prepare(tmp_path: Path):
    """CUB's default (`verify_images: decode`) decodes every image in prepare; the header check alone
    passes such a file, which used to fail only at embed time, after training."""
    fake = make_cub(tmp_path / "raw")
    victim = next(iter(fake.images))
    path = fake.root / victim
    noise = np.random.default_rng(0).integers(0, 256, size=(192, 256, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, quality=95)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    assert unreadable_images([path]) == []
    with pytest.raises(ImageCheckError, match=rf"verify_images: decode(?s:.*){re.escape(str(path))}"):
        cub200.prepare(fake.config("cub200"), tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.csv").exists()
    with pytest.raises(DatasetConfigError, match="`verify_images` must be false, true .* or 'decode'"):
        cub200.prepare(fake.config("cub200", verify_images="full"), tmp_path / "out")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("data.tgz", b"plain text, not gzip"),
        ("data.tgz", None),  # a real .tgz cut in half
        ("data.zip", b"PK\x03\x04 not a zip"),
    ],
)
def test_a_damaged_archive_names_the_file_and_extracts_nothing(tmp_path: Path, name: str, content: bytes | None):
    if content is None:
        blob = io.BytesIO()
        with tarfile.open(fileobj=blob, mode="w:gz") as archive:
            data = np.random.default_rng(0).bytes(50_000)
            info = tarfile.TarInfo("Data/blob.bin")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        content = blob.getvalue()[: len(blob.getvalue()) // 2]
    path = tmp_path / name
    path.write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(DamagedArchiveError, match=rf"(?s){re.escape(str(path))}: not a readable .* fetch it again"):
        extract_archive(path, out)
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"device": "tpu"}, "training.device = 'tpu' is not a device name; use auto, cpu"),
        ({"device": "cuda:7"}, "training.device = 'cuda:7', but this machine has .* cuda device"),
        (
            {"image": {"resize": 24, "test_crop": 32, "train_crop": 20}},
            "test_crop = 32 px exceeds training.image.resize = 24 px.*set test_crop <= resize",
        ),
        (
            {"backbone": {"width": 4, "pretrained": "imagenet", "freeze_bn": False}},
            "training.backbone.pretrained = 'imagenet', but .*small_cnn has no published ImageNet weights; set it to null",
        ),
    ],
)
def test_impossible_training_settings_name_the_key_before_training(
    tmp_path: Path, capsys, training: dict, message: str
):
    code, out = _train(tmp_path, {"training": {**TINY_TRAINING, **training}})
    assert code == 2 and re.search(message, capsys.readouterr().err)
    assert not out.exists() and not (tmp_path / "scratch").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.assign(label=f["label"] + ".5"), r"column 'label' must hold integer class ids; line\(s\) 2, 3"),
        (
            lambda f: f.assign(split=f["split"].where(f.index % 7 != 0, "test")),
            r"label\(s\) appear in both \['train', 'val'\] and the evaluation splits, e.g. label 0 on lines 2",
        ),
        (lambda f: f.iloc[:0], r"no rows"),
        (lambda f: f.assign(bbox="1 2 3"), r"bbox on line\(s\) 2, 3.*: not 4 numbers \(found '1 2 3'\)"),
        (
            lambda f: f.assign(bbox=["1 1 4 4"] * 3 + ["1 2 -3 4"] * (len(f) - 3)),
            r"bbox on line\(s\) 5, .*width and height must be positive",
        ),
        (lambda f: f.assign(bbox="-1 0 4 4"), r"x and y must be >= 0"),
    ],
)
def test_a_manifest_with_wrong_labels_or_boxes_is_refused(tmp_path: Path, capsys, edit, message: str):
    """A fractional label was truncated, a class on both sides of the split trained and tested on
    the same class, and a negative box width reached DeML's health check: all used to exit 0."""
    manifest = _manifest_with(tmp_path, edit)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--dataset",
            "synthetic",
            "--method",
            "triplet",
            "--seed",
            "0",
            "--manifest",
            str(manifest),
            "--out",
            str(out),
            "--scratch-dir",
            str(tmp_path / "scratch"),
            "--no-progress",
            "--config",
            str(REPO / "params.yaml"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and str(manifest) in err and re.search(message, err) and not out.exists()


@pytest.mark.parametrize(
    ("checkpoint", "lacks"),
    [({"model": {}}, "no 'run' entry (found ['model'])"), (torch.zeros(3), "no 'run', 'model' entry (found Tensor)")],
)
def test_a_checkpoint_that_is_not_a_run_names_what_it_lacks(tmp_path: Path, capsys, checkpoint, lacks: str):
    """A dict without 'run' gave `error: run`; a saved tensor gave an IndexError traceback."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save(checkpoint, run / "checkpoint.pt")
    assert main(["embed", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'checkpoint.pt'}: not a dmlbench checkpoint: {lacks}" in err
    assert "re-create it with `dmlbench train`" in err and not (run / "embeddings.npz").exists()


def test_an_output_path_that_is_a_folder_is_named(tmp_path: Path, capsys):
    path = tmp_path / "e.npz"
    np.savez(path, embeddings=np.eye(4, dtype=np.float32), labels=np.array([0, 0, 1, 1]))
    assert main(["evaluate", str(path), "--out", str(tmp_path), "--recall-ks", "1"]) == 2
    assert f"{tmp_path}: is a folder; name a file to write" in capsys.readouterr().err
    blocker = tmp_path / "plain_file"
    blocker.write_text("")
    assert main(["evaluate", str(path), "--out", str(blocker / "m.json"), "--recall-ks", "1"]) == 2
    assert f"because {blocker} is a file, not a folder" in capsys.readouterr().err


def test_ensemble_members_that_disagree_are_named_by_file(tmp_path: Path, capsys):
    rng = np.random.default_rng(0)
    first, second = tmp_path / "a.npz", tmp_path / "b.npz"
    np.savez(first, embeddings=rng.normal(size=(4, 3)).astype(np.float32), labels=np.array([0, 0, 1, 1]))
    np.savez(second, embeddings=rng.normal(size=(4, 3)).astype(np.float32), labels=np.array([1, 1, 0, 0]))
    assert main(["ensemble", str(first), str(second), "--out", str(tmp_path / "ens.npz")]) == 2
    err = capsys.readouterr().err
    assert f"ensemble: {second} has other labels (or another row order) than {first}" in err
    assert "embed every member from the same prepared dataset" in err and not (tmp_path / "ens.npz").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["report", "table1"],
            r"results/runs/synthetic/\w+/seed0/metrics.json: metrics file not found; build the runs",
        ),
        (["figure", "abe_fig5"], r"embeddings.npz: embeddings file not found; write it with `dmlbench embed RUN_DIR`"),
    ],
)
def test_reports_before_their_runs_say_how_to_build_them(tmp_path: Path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--config", str(REPO / "params.yaml")]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not list(tmp_path.rglob("*.tex")) and not list(tmp_path.rglob("*.png"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            b"training:\n  epochs: 1\n  epochs: 2\n",
            r"(?s)key 'epochs' appears twice in one mapping \(first on line 2\).*line 3",
        ),
        (b"seeds: [0]\n\xff\n", r"not UTF-8 text .*save it as UTF-8"),
        (b"tables:\n  table1:\n    seeds: [0, 0]\n", r"tables.table1.seeds: \[0, 0\] has non-unique elements"),
    ],
)
def test_parameter_files_that_yaml_would_misread_are_refused(tmp_path: Path, text: bytes, message: str):
    """PyYAML keeps the last of two equal keys without a word: the first value was silently ignored."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_bytes(text)
    with pytest.raises(ConfigError, match=message):
        load_config([REPO / "params.yaml", overlay])
