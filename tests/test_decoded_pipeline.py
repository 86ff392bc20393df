"""The decoded_uint8 pipeline: the image store, evaluation crops, augmentation on the device, training with it."""

from __future__ import annotations

import math
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision.transforms.functional as TF
from conftest import tiny_run
from PIL import Image
from torchvision import transforms as T

from dmlbench.data.device_augment import augment_batch, crop_and_resize, random_resized_boxes
from dmlbench.data.image_store import ImageStoreError, open_store, stored_size
from dmlbench.data.images import load_rgb
from dmlbench.data.stored_dataset import StoredImageDataset, model_inputs, pad_collate
from dmlbench.data.transforms import eval_transform
from dmlbench.settings import ImageSettings
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.data import load_run_data
from dmlbench.training.trainer import train_run

IMAGE = ImageSettings(resize=32, test_crop=28, train_crop=24, crop_scale=(0.3, 1.0), flip=True)


def smooth_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: random low-frequency colour fields (what photographs look like to a resampler)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(max(2, height // 8), max(2, width // 8), 3)).astype(np.uint8)
    return np.array(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    """JPEG, PNG and greyscale files of assorted sizes and aspect ratios (portrait, landscape, square, small)."""
    shapes = [(60, 45), (45, 60), (32, 32), (37, 101), (29, 30), (120, 33)]
    paths = []
    for i, (height, width) in enumerate(shapes):
        array = smooth_image(height, width, seed=i)
        image = Image.fromarray(array).convert("L") if i == 4 else Image.fromarray(array)
        path = tmp_path / "img" / f"{i}.{'jpg' if i % 2 else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path)
        paths.append(str(path))
    return paths


def test_stored_sizes_are_torchvisions_resize_sizes():
    for width, height in [(500, 375), (375, 500), (333, 500), (64, 64), (101, 37), (37, 101), (1000, 999)]:
        resized = T.Resize(256)(Image.new("RGB", (width, height)))
        assert stored_size(width, height, 256) == (resized.height, resized.width)


def test_evaluation_items_hold_exactly_the_pixels_of_the_pil_test_transform(images, tmp_path):
    store = open_store(images, IMAGE.resize, root=tmp_path / "stores")
    dataset = StoredImageDataset(store, images, np.arange(len(images)), IMAGE, train=False)
    for row, path in enumerate(images):
        expected = eval_transform(IMAGE.resize, IMAGE.test_crop)(load_rgb(path))  # (3, 28, 28) float in [0, 1]
        stored, _, _ = dataset[row]
        assert stored.dtype == torch.uint8 and stored.shape == (28, 28, 3)
        model_input = dataset.to_model_input(stored[None], torch.tensor([row]))[0]
        assert torch.equal(model_input, expected), path


def test_the_store_is_built_once_and_a_changed_file_makes_a_new_one(images, tmp_path):
    root = tmp_path / "stores"
    first = open_store(images, 32, root=root)
    again = open_store(list(reversed(images)) + images[:1], 32, root=root)  # another order, a duplicate
    assert first.folder != again.folder  # the order is the row order
    same = open_store(images, 32, root=root)
    assert same.folder == first.folder and len(list(root.iterdir())) == 4  # two stores and their locks
    Image.fromarray(smooth_image(50, 50, seed=9)).save(images[0])
    changed = open_store(images, 32, root=root)
    assert changed.folder != first.folder
    assert np.array_equal(
        changed.image(0), np.asarray(Image.open(images[0]).convert("RGB").resize((32, 32), Image.BILINEAR))
    )


def _open_in_process(args: tuple[list[str], str]) -> str:
    paths, root = args
    return str(open_store(paths, 32, root=Path(root)).folder)


def test_concurrent_jobs_build_one_store_and_leave_no_temporary_folder(images, tmp_path):
    root = tmp_path / "stores"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        folders = pool.map(_open_in_process, [(images, str(root))] * 3)
    assert len(set(folders)) == 1
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [Path(folders[0]).name]


def test_a_killed_build_leaves_no_store_and_the_next_build_sweeps_its_remains(images, tmp_path):
    root = tmp_path / "stores"
    store = open_store(images, 32, root=root)
    folder = store.folder
    folder.rename(folder.with_name(f"{folder.name}.tmp-999999"))  # what a build killed before its rename leaves
    again = open_store(images, 32, root=root)
    assert again.folder == folder and np.array_equal(again.image(3), store.image(3))
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [folder.name]


def test_a_damaged_image_is_named_and_leaves_no_store(images, tmp_path):
    Path(images[2]).write_bytes(Image.open(images[2]).tobytes()[:50])  # not an image file any more
    root = tmp_path / "stores"
    with pytest.raises(ImageStoreError, match=rf"{images[2]}.*fix or replace the file"):
        open_store(images, 32, root=root, workers=2)
    assert not [p for p in root.iterdir() if p.is_dir()]


FULL_DISK_BUILD = """
import resource, signal, sys
from dmlbench.data.image_store import ImageStoreError, open_store
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the limit then fails the write with EFBIG, not the process
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
try:
    open_store(sys.argv[3:], 32, root=sys.argv[2])
except ImageStoreError as err:
    print(err)
    sys.exit(3)
"""


@pytest.mark.parametrize("limit", [1, 2000])
def test_a_store_that_does_not_fit_on_the_disk_is_refused_with_the_space_it_needs(images, tmp_path, limit):
    """A process that may write at most ``limit`` bytes per file (the 6 images need ~11 kB): the build
    reserves the space first, so it stops with the fix instead of dying of SIGBUS in the memory map."""
    import subprocess

    root = tmp_path / "stores"
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_BUILD, str(limit), str(root), *images],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "no space left for the decoded-image store in" in done.stdout
    assert "GB are free" in done.stdout and "DMLBENCH_IMAGE_STORE" in done.stdout
    assert not [p for p in root.iterdir() if p.is_dir()]  # no store and no temporary folder left


def test_a_file_system_that_cannot_preallocate_gets_a_sparse_file(images, tmp_path, monkeypatch):
    import errno
    import os

    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    store = open_store(images, 32, root=tmp_path / "stores")
    assert store.image(0).shape == (42, 32, 3)


def test_a_missing_image_is_named_with_the_fix(images, tmp_path):
    Path(images[1]).unlink()
    with pytest.raises(ImageStoreError, match=rf"cannot read image {images[1]}: .*re-run `dmlbench prepare`"):
        open_store(images, 32, root=tmp_path / "stores")


def test_a_damaged_store_is_named_with_the_fix(images, tmp_path):
    store = open_store(images, 32, root=tmp_path / "stores")
    pixels = store.folder / "pixels.u8"
    pixels.write_bytes(pixels.read_bytes()[:1000])
    with pytest.raises(ImageStoreError, match=rf"{store.folder}: damaged image store .*delete the folder"):
        open_store(images, 32, root=tmp_path / "stores")


def test_random_boxes_follow_torchvisions_random_resized_crop_distribution():
    sizes = torch.tensor([[90, 120]] * 4000)
    boxes = random_resized_boxes(sizes, (0.08, 1.0), torch.Generator().manual_seed(0))
    top, left, height, width = boxes.T.double()
    assert bool((top >= 0).all() and (left >= 0).all() and (top + height <= 90).all() and (left + width <= 120).all())
    ours_area = (height * width / (90 * 120)).numpy()
    ours_aspect = (width / height).numpy()
    torch.manual_seed(0)
    theirs = np.array(
        [T.RandomResizedCrop.get_params(Image.new("RGB", (120, 90)), [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(4000)],
        dtype=np.float64,
    )
    theirs_area, theirs_aspect = theirs[:, 2] * theirs[:, 3] / (90 * 120), theirs[:, 3] / theirs[:, 2]
    for ours, theirs_values in ((ours_area, theirs_area), (ours_aspect, theirs_aspect)):
        assert abs(ours.mean() - theirs_values.mean()) < 0.02
        assert abs(np.quantile(ours, 0.1) - np.quantile(theirs_values, 0.1)) < 0.03
        assert abs(np.quantile(ours, 0.9) - np.quantile(theirs_values, 0.9)) < 0.03
    centre_x = (left + width / 2).numpy()
    assert abs(centre_x.mean() - 60) < 1.5  # offsets uniform: crops centred on average


def test_an_impossible_crop_falls_back_to_torchvisions_centre_crop():
    """A 5 × 300 strip cannot hold a crop of aspect 3/4..4/3 covering ≥ 90 % of it: the whole height,
    cut to aspect 4/3 and centred, as torchvision does."""
    box = random_resized_boxes(torch.tensor([[5, 300]]), (0.9, 1.0), torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    assert box[0].tolist() == list(
        T.RandomResizedCrop.get_params(Image.new("RGB", (300, 5)), [0.9, 1.0], [3 / 4, 4 / 3])
    )
    assert box[0].tolist() == [0, 146, 5, 7]


def test_crop_and_resize_is_exact_at_the_same_size_and_close_to_pil_when_resampling():
    array = smooth_image(60, 80)
    images = torch.from_numpy(array)[None]
    whole = crop_and_resize(images, torch.tensor([[0, 0, 60, 80]]), 60)  # 80 → 60 wide, 60 → 60 high
    same = crop_and_resize(images[:, :40, :40], torch.tensor([[0, 0, 40, 40]]), 40)
    assert torch.equal(same[0], TF.to_tensor(Image.fromarray(array[:40, :40])))
    for box, size in (([10, 5, 40, 50], 24), ([3, 7, 20, 15], 48), ([0, 0, 60, 80], 60)):
        top, left, height, width = box
        pil = TF.to_tensor(
            TF.resized_crop(
                Image.fromarray(array),
                top,
                left,
                height,
                width,
                [size, size],
                interpolation=T.InterpolationMode.BILINEAR,
                antialias=True,
            )
        )
        ours = crop_and_resize(images, torch.tensor([box]), size)[0] if box != [0, 0, 60, 80] else whole[0]
        assert (ours - pil).abs().mean() < 0.015, box
        assert (ours - pil).abs().max() < 0.12, box


def test_padding_never_reaches_a_crop_at_an_image_border():
    small, large = smooth_image(30, 20, seed=1), smooth_image(50, 70, seed=2)
    batch, _, _ = pad_collate(
        [(torch.from_numpy(small), torch.tensor(0), 0), (torch.from_numpy(large), torch.tensor(1), 1)]
    )
    corner = torch.tensor([[10, 5, 20, 15], [0, 0, 50, 70]])  # small's crop ends at its last row and column
    padded = crop_and_resize(batch, corner, 16)
    alone = crop_and_resize(torch.from_numpy(small)[None], corner[:1], 16)
    assert torch.equal(padded[0], alone[0])


class ClaimsCuda(torch.Tensor):
    """A CPU tensor that answers ``is_cuda`` with True: what torchvision's Python wrappers see of a GPU batch."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_deterministic_mode_on_a_gpu_never_takes_torchvisions_pure_python_roi_align(monkeypatch):
    """On CUDA inputs under ``torch.use_deterministic_algorithms`` (``training.deterministic``),
    ``torchvision.ops.roi_align`` runs a pure-PyTorch version that samples the whole padded image for
    every output pixel: a GPU run never finished its first epoch. The kernel's forward is deterministic;
    the augmentation must call it, whatever the mode and the device."""
    roi_align_module = sys.modules["torchvision.ops.roi_align"]  # the package re-exports the function under its name

    def fallback(*args, **kwargs):
        raise AssertionError("torchvision's pure-PyTorch roi_align was called")

    monkeypatch.setattr(roi_align_module, "_roi_align", fallback)
    images = torch.from_numpy(np.stack([smooth_image(40, 50, seed=s) for s in range(3)]))
    boxes = torch.tensor([[0, 0, 40, 50], [5, 7, 20, 30], [10, 0, 30, 25]])
    expected = crop_and_resize(images, boxes, 16)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        gpu_like = images.as_subclass(ClaimsCuda)
        assert gpu_like.is_cuda
        crops = crop_and_resize(gpu_like, boxes, 16)
        augmented = augment_batch(
            gpu_like, torch.tensor([[40, 50]] * 3), 16, (0.5, 1.0), True, torch.Generator().manual_seed(0)
        )
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(crops.as_subclass(torch.Tensor), expected)
    assert augmented.shape == (3, 3, 16, 16)


def test_augmentation_is_seeded_and_flips_half_the_images():
    batch = torch.from_numpy(np.stack([smooth_image(40, 40, seed=s) for s in range(200)]))
    sizes = torch.tensor([[40, 40]] * 200)

    def run(seed: int, flip: bool) -> torch.Tensor:
        return augment_batch(batch, sizes, 16, (0.5, 1.0), flip, torch.Generator().manual_seed(seed))

    assert torch.equal(run(0, True), run(0, True)) and not torch.equal(run(0, True), run(1, True))
    plain, flipped = run(0, False), run(0, True)
    mirrored = [torch.equal(f, p.flip(-1)) for f, p in zip(flipped, plain)]
    unchanged = [torch.equal(f, p) for f, p in zip(flipped, plain)]
    assert all(m or u for m, u in zip(mirrored, unchanged))
    assert 70 < sum(mirrored) < 130
    assert plain.shape == (200, 3, 16, 16) and 0 <= plain.min() and plain.max() <= 1


def decoded_run(params: dict, workers: int) -> dict:
    run = tiny_run(params, epochs=2)
    run["training"].update(pipeline="decoded_uint8", num_workers=workers)
    return run


def test_training_on_the_decoded_pipeline_is_seeded_and_independent_of_the_loader_workers(
    params, tiny_manifest, tmp_path
):
    """The boxes and flips are drawn in the training process: 0 or 2 loader workers give the same bits."""
    weights, logs = {}, {}
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        train_run(decoded_run(params, workers), tiny_manifest, out, tmp_path / f"s{workers}", progress=False)
        weights[workers] = load_checkpoint(out / "checkpoint.pt")["model"]
        logs[workers] = pd.read_csv(out / "log.csv")[["loss", "val_R@1"]]
    assert all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
    pd.testing.assert_frame_equal(logs[0], logs[2])
    assert math.isfinite(logs[0]["loss"].iloc[-1])


def test_run_data_of_the_decoded_pipeline_matches_the_pil_pipelines_evaluation_inputs(params, tiny_manifest):
    pil_run, decoded = tiny_run(params), decoded_run(params, 0)
    pil_data, stored_data = load_run_data(pil_run, tiny_manifest), load_run_data(decoded, tiny_manifest)
    assert isinstance(stored_data.test, StoredImageDataset) and stored_data.train.train
    rows = list(range(len(pil_data.test)))
    assert torch.equal(
        model_inputs(stored_data.test, rows, torch.device("cpu")),
        model_inputs(pil_data.test, rows, torch.device("cpu")),
    )
    train_view = stored_data.train.evaluation_view(stored_data.test)
    assert torch.equal(
        model_inputs(train_view, [0, 1], torch.device("cpu")),
        model_inputs(pil_data.train.evaluation_view(pil_data.test), [0, 1], torch.device("cpu")),
    )
