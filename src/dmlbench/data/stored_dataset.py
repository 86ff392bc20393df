"""Datasets of the ``decoded_uint8`` pipeline: uint8 images from an :class:`ImageStore`, augmented on the device.

The loader's work per image is a copy out of the memory-mapped store (no decoding, no resampling):

- evaluation items are the centre ``test_crop`` × ``test_crop`` crop of the stored image, whose
  shorter side is already ``resize`` px, so they hold exactly the pixels of the ``pil`` pipeline's
  test transform (Resize, CenterCrop), as uint8;
- training items are the whole stored image; :func:`pad_collate` pads a batch into one uint8 tensor
  and :meth:`StoredImageDataset.to_model_input` crops, resizes and flips it on the training device
  (:mod:`dmlbench.data.device_augment`). The random crops are thus cut from the stored image (shorter
  side ``resize``) rather than from the full-resolution file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from dmlbench.data.dataset import ImageDataset
from dmlbench.data.device_augment import augment_batch
from dmlbench.data.image_store import ImageStore
from dmlbench.data.transforms import eval_transform, training_transform
from dmlbench.settings import ImageSettings


def centre_crop_origin(height: int, width: int, crop: int) -> tuple[int, int]:
    """Top and left (px) of torchvision's ``CenterCrop(crop)`` of a height × width image.

    >>> centre_crop_origin(64, 85, 56), centre_crop_origin(341, 256, 224)
    ((4, 14), (58, 16))
    """
    return int(round((height - crop) / 2.0)), int(round((width - crop) / 2.0))


def pad_collate(items: list[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batch images of different sizes: each in the top-left corner of one (B, H, W, 3) uint8 canvas
    (H, W the largest height and width), its last column and row repeated into the padding.

    Returns:
        images (B, H, W, 3) uint8, labels (B,) int64, indices (B,) int64.

    >>> a, b = torch.full((2, 3, 3), 7, dtype=torch.uint8), torch.full((3, 1, 3), 9, dtype=torch.uint8)
    >>> images, _, _ = pad_collate([(a, torch.tensor(0), 0), (b, torch.tensor(1), 1)])
    >>> images.shape, images[0, :, :, 0].tolist(), images[1, :, :, 0].tolist()
    (torch.Size([2, 3, 3, 3]), [[7, 7, 7], [7, 7, 7], [7, 7, 7]], [[9, 9, 9], [9, 9, 9], [9, 9, 9]])
    """
    height = max(image.shape[0] for image, _, _ in items)
    width = max(image.shape[1] for image, _, _ in items)
    canvas = torch.empty((len(items), height, width, 3), dtype=torch.uint8)
    if get_worker_info() is not None:  # a loader process: fill shared memory, which the trainer maps without a copy
        canvas.share_memory_()
    for slot, (image, _, _) in enumerate(items):
        h, w = image.shape[:2]
        canvas[slot, :h, :w] = image
        canvas[slot, :h, w:] = image[:, w - 1 : w]
        canvas[slot, h:] = canvas[slot, h - 1 : h]
    labels = torch.stack([label for _, label, _ in items])
    return canvas, labels, torch.tensor([index for _, _, index in items], dtype=torch.int64)


class StoredImageDataset(Dataset):
    """Images of a store with integer labels; items ``(image, label, index)`` as :class:`ImageDataset`'s,
    but ``image`` is uint8 (height, width, 3): a copy of the centre crop (evaluation), or the whole stored
    image (training) as a view of the mapped store, which :func:`pad_collate` copies into the batch.

    Args:
        store: the decoded images (:func:`dmlbench.data.image_store.open_store`).
        paths: N image files, each in the store.
        labels: (N,) int labels.
        image: the run's ``training.image`` settings.
        train: training items (augmented on the device) rather than evaluation items.

    Attributes:
        transform: the ``pil`` pipeline's transform with the same geometry (used to carry object
            boxes through the test-time crop, :func:`dmlbench.methods.deml.transformed_box`).
        random_in_workers: False: an item is a plain copy (the random crops are drawn in the training
            process), so the trainer keeps its loader workers for the whole run.
    """

    random_in_workers = False

    def __init__(self, store: ImageStore, paths: Sequence[str], labels: np.ndarray, image: ImageSettings, train: bool):
        if len(paths) != len(labels):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.store = store
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.image = image
        self.train = train
        self.rows = np.array([store.row_of[str(path)] for path in self.paths], dtype=np.int64)
        self.sizes = torch.from_numpy(store.sizes[self.rows].copy())
        self.transform: Callable[[Image.Image], torch.Tensor] = (
            training_transform(image) if train else eval_transform(image.resize, image.test_crop)
        )
        self.collate_fn: Callable[[list[Any]], Any] | None = pad_collate if train else None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        stored = self.store.image(int(self.rows[index]))
        if not self.train:
            crop = self.image.test_crop
            top, left = centre_crop_origin(stored.shape[0], stored.shape[1], crop)
            stored = np.ascontiguousarray(stored[top : top + crop, left : left + crop])
        return torch.from_numpy(stored), torch.tensor(self.labels[index]), index

    def evaluation_view(self, test: Dataset | None = None) -> "StoredImageDataset":
        """These rows as evaluation delivers them (centre crops); ``test`` is not needed here."""
        return StoredImageDataset(self.store, self.paths, self.labels, self.image, train=False)

    def to_model_input(
        self, images: torch.Tensor, indices: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A loader batch on the device → (B, 3, H, W) float32 in [0, 1]: the centre crops scaled, or
        (training) the random resized crops and flips drawn from ``generator``.

        Raises:
            ValueError: training items without a generator.
        """
        if not self.train:
            return images.permute(0, 3, 1, 2).float().div_(255.0)
        if generator is None:
            raise ValueError("training items of the decoded_uint8 pipeline need the epoch's augmentation generator")
        return augment_batch(
            images, self.sizes[indices.cpu()], self.image.train_crop, self.image.crop_scale, self.image.flip, generator
        )


#: A dataset a loader reads in either pipeline (``training.pipeline``: ``pil`` or ``decoded_uint8``).
ImageSet = ImageDataset | StoredImageDataset


def model_inputs(dataset: ImageSet, rows: Sequence[int], device: torch.device) -> torch.Tensor:
    """(B, 3, H, W) float model inputs of the evaluation items ``rows`` of either kind of dataset, on ``device``.

    Raises:
        ValueError: training items of the ``decoded_uint8`` pipeline (take the dataset's ``evaluation_view``).
    """
    images = torch.stack([dataset[int(row)][0] for row in rows]).to(device)
    return dataset.to_model_input(images, torch.as_tensor(list(rows)))
