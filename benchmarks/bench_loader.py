"""Benchmark: images per second the training loader delivers, per core, for both pipelines.

A GPU trains faster than one core can decode JPEGs: on one H100, ResNet-50 with AMP at 224 px trains
2,509 img/s and EfficientNet-Lite0 with AMP at 128 px 2,016 img/s (measured in issue 21). The loader
alone (no model) must deliver that with the cores a GPU node has per GPU. For each pipeline
(``training.pipeline``) and crop size this prints the loader's images/s with 1 and 2 worker
processes, the rate per core, and the cores a GPU would need at that rate:

- ``pil``: each item decodes its JPEG and applies RandomResizedCrop + flip + ToTensor (PIL);
- ``decoded_uint8``: each item is a copy out of the memory-mapped store, batched by ``pad_collate``;
  the crop, flip and scaling then run on the training device. Their cost on this CPU is printed
  separately ("device augmentation on the CPU"), as is the one-time decode of the store.

The images: ``--count`` files from ``--source`` (default ``$DMLBENCH_CUB200_ROOT/images``), each
re-encoded as a JPEG (quality 90) at ``--size`` (default 500 × 375, an original CUB photograph;
the development copy of CUB is downscaled and would flatter the decoder); without a source,
smooth random images.

    python benchmarks/bench_loader.py
    python benchmarks/bench_loader.py --source /data/CUB_200_2011/images --count 1024 --workers 1 2 4
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from dmlbench.data.dataset import ImageDataset
from dmlbench.data.device_augment import augment_batch
from dmlbench.data.image_store import open_store
from dmlbench.data.stored_dataset import ImageSet, StoredImageDataset
from dmlbench.data.transforms import training_transform
from dmlbench.settings import ImageSettings

#: One-GPU training throughput to feed (img/s, H100, AMP): crop size → (backbone, img/s).
GPU_TARGETS = {224: ("ResNet-50", 2509.0), 128: ("EfficientNet-Lite0", 2016.0)}
#: Test-time shorter side per crop size (the 256/224 ratio), which is also the store's shorter side.
RESIZE = {224: 256, 128: 146}


def write_images(folder: Path, count: int, size: tuple[int, int], source: Path | None) -> list[str]:
    """``count`` JPEGs of ``size`` (width, height) in ``folder``, from ``source``'s images when given."""
    files = (
        sorted(p for p in source.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:count] if source else []
    )
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        if files:
            image = Image.open(files[i % len(files)]).convert("RGB").resize(size, Image.BICUBIC)
        else:
            coarse = rng.integers(0, 256, size=(size[1] // 16, size[0] // 16, 3)).astype(np.uint8)
            image = Image.fromarray(coarse).resize(size, Image.BICUBIC)
        path = folder / f"{i:05d}.jpg"
        image.save(path, quality=90)
        paths.append(str(path))
    return paths


def loader_rate(dataset: ImageSet, workers: int, batch_size: int, passes: int) -> float:
    """Images per second delivered by a shuffling DataLoader over ``dataset`` (after one warm-up batch)."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        collate_fn=dataset.collate_fn,
        generator=torch.Generator().manual_seed(0),
        persistent_workers=workers > 0,
    )
    next(iter(loader))
    started, seen = time.perf_counter(), 0
    for _ in range(passes):
        for images, _, _ in loader:
            seen += len(images)
    return seen / (time.perf_counter() - started)


def augmentation_rate(dataset: StoredImageDataset, batch_size: int, batches: int) -> float:
    """Images per second of :func:`augment_batch` on this CPU (what a CPU run pays; a GPU run does it on the GPU)."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        collate_fn=dataset.collate_fn,
        generator=torch.Generator().manual_seed(0),
    )
    generator = torch.Generator().manual_seed(0)
    elapsed, seen = 0.0, 0
    for step, (images, _, indices) in enumerate(loader):
        if step == batches:
            break
        started = time.perf_counter()
        augment_batch(
            images, dataset.sizes[indices], dataset.image.train_crop, dataset.image.crop_scale, True, generator
        )
        elapsed += time.perf_counter() - started
        seen += len(images)
    return seen / elapsed


def report(name: str, crop: int, rates: Iterable[tuple[int, float]]) -> None:
    backbone, target = GPU_TARGETS[crop]
    for workers, rate in rates:
        per_core = rate / max(workers, 1)
        print(
            f"  {name:14s} {crop:4d} px  {workers} worker(s): {rate:8.0f} img/s = {per_core:7.0f} per core"
            f"  → {target / per_core:5.1f} cores to feed {backbone} ({target:.0f} img/s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_source = os.environ.get("DMLBENCH_CUB200_ROOT")
    parser.add_argument(
        "--source",
        type=Path,
        default=Path(default_source) / "images" if default_source else None,
        help="folder of images to re-encode (default $DMLBENCH_CUB200_ROOT/images)",
    )
    parser.add_argument("--count", type=int, default=512, help="images in the benchmark set")
    parser.add_argument("--size", default="500x375", help="width x height of each JPEG (px)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="loader processes to time")
    parser.add_argument("--crops", type=int, nargs="+", default=[128, 224], choices=sorted(GPU_TARGETS))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2, help="passes over the set per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_images(folder, args.count, (width, height), args.source)
        labels = np.arange(len(paths)) % 16
        mean_kb = np.mean([os.path.getsize(p) for p in paths]) / 1024
        print(
            f"{len(paths)} JPEGs of {width}×{height} px (mean {mean_kb:.0f} KB) from "
            f"{args.source or 'random smooth images'}; {os.cpu_count()} cores here; batch {args.batch_size}"
        )
        for crop in args.crops:
            image = ImageSettings(
                resize=RESIZE[crop], test_crop=crop, train_crop=crop, crop_scale=(0.08, 1.0), flip=True
            )
            pil = ImageDataset(paths, labels, training_transform(image))
            report("pil", crop, [(w, loader_rate(pil, w, args.batch_size, args.passes)) for w in args.workers])
            started = time.perf_counter()
            store = open_store(paths, RESIZE[crop], workers=1, root=folder / "store")
            build = len(paths) / (time.perf_counter() - started)
            stored = StoredImageDataset(store, paths, labels, image, train=True)
            report(
                "decoded_uint8", crop, [(w, loader_rate(stored, w, args.batch_size, args.passes)) for w in args.workers]
            )
            print(
                f"  {'':14s} {crop:4d} px  one-time store decode: {build:.0f} img/s on one core; "
                f"device augmentation on the CPU: {augmentation_rate(stored, args.batch_size, 8):.0f} img/s "
                f"on one thread"
            )


if __name__ == "__main__":
    main()
