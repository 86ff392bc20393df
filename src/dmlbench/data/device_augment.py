"""Training augmentation of a whole batch on the training device: random resized crop, flip, scaling.

The loader of the ``decoded_uint8`` pipeline delivers uint8 images of different sizes padded into one
(B, H, W, 3) tensor; here, on the device the model trains on, every image gets torchvision's
``RandomResizedCrop`` box (same distribution: area share in ``crop_scale``, aspect ratio log-uniform
in [3/4, 4/3], ten tries, then the centre crop), is cut and resampled to ``train_crop`` px by
torchvision's ``roi_align`` kernel (bilinear; when shrinking, the mean of ⌈box / output⌉² bilinear
samples per output pixel, which antialiases as PIL's resize does), flipped with probability ½, and
scaled to [0, 1]. The ImageNet normalisation follows inside the backbone, as on every pipeline.

The kernel is called through ``torch.ops.torchvision.roi_align``, not ``torchvision.ops.roi_align``:
with ``torch.use_deterministic_algorithms`` on (``training.deterministic``), the Python wrapper
sends CUDA inputs to a pure-PyTorch version that, with the adaptive sampling used here, samples the
whole padded image for every output pixel (~6×10¹⁰ samples per cub_lite batch against ≤ 10⁷ for
the kernel: a GPU run never finished its first epoch). The wrapper does that because the kernel's
*backward* adds with atomics; its forward computes each output on its own and is deterministic, and
this augmentation has no backward (it runs under ``torch.no_grad``).

The boxes and flips are drawn on the CPU from a seeded generator in the training process, so a run's
augmentation does not depend on the number of loader workers or on the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)

#: Aspect ratios (width / height) of the random crops: torchvision's default.
CROP_RATIOS = (3.0 / 4.0, 4.0 / 3.0)
#: Tries per image before falling back to the centre crop: torchvision's number.
CROP_TRIES = 10
#: ``roi_align``'s sampling_ratio that samples ⌈box / output⌉ points per output pixel and axis.
ADAPTIVE_SAMPLING = -1


def random_resized_boxes(
    sizes: torch.Tensor, scale: Sequence[float], generator: torch.Generator, ratios: tuple[float, float] = CROP_RATIOS
) -> torch.Tensor:
    """One ``RandomResizedCrop`` box per image, drawn as torchvision draws it.

    Args:
        sizes: (B, 2) int64 height and width of each image (px).
        scale: (low, high) share of the image area a crop covers.
        generator: CPU generator the draws come from.
        ratios: (low, high) aspect ratio (width / height).

    Returns:
        (B, 4) int64 top, left, height and width of each crop (px), inside its image.

    >>> boxes = random_resized_boxes(torch.tensor([[100, 80], [5, 300]]), (0.5, 1.0), torch.Generator().manual_seed(0))
    >>> bool(((boxes[:, :2] >= 0) & (boxes[:, :2] + boxes[:, 2:] <= torch.tensor([[100, 80], [5, 300]]))).all())
    True
    """
    sizes = sizes.to(torch.float64)
    height, width = sizes[:, :1], sizes[:, 1:]
    count = len(sizes)
    area = height * width * torch.empty(count, CROP_TRIES, dtype=torch.float64).uniform_(*scale, generator=generator)
    log_low, log_high = math.log(ratios[0]), math.log(ratios[1])
    aspect = torch.exp(
        torch.empty(count, CROP_TRIES, dtype=torch.float64).uniform_(log_low, log_high, generator=generator)
    )
    crop_w = torch.round(torch.sqrt(area * aspect))
    crop_h = torch.round(torch.sqrt(area / aspect))
    fits = (crop_w > 0) & (crop_w <= width) & (crop_h > 0) & (crop_h <= height)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    found = fits.any(dim=1)
    crop_w, crop_h = crop_w.gather(1, first)[:, 0], crop_h.gather(1, first)[:, 0]
    offsets = torch.rand(count, 2, dtype=torch.float64, generator=generator)
    top = torch.floor(offsets[:, 0] * (height[:, 0] - crop_h + 1))
    left = torch.floor(offsets[:, 1] * (width[:, 0] - crop_w + 1))
    centre = _centre_boxes(height[:, 0], width[:, 0], ratios)
    boxes = torch.stack([top, left, crop_h, crop_w], dim=1)
    return torch.where(found[:, None], boxes, centre).to(torch.int64)


def _centre_boxes(height: torch.Tensor, width: torch.Tensor, ratios: tuple[float, float]) -> torch.Tensor:
    """torchvision's fallback: the whole image, cut to the nearest allowed aspect ratio, centred. (B, 4) float64."""
    in_ratio = width / height
    narrow, wide = in_ratio < ratios[0], in_ratio > ratios[1]
    crop_w = torch.where(wide, torch.round(height * ratios[1]), width)
    crop_h = torch.where(narrow, torch.round(width / ratios[0]), height)
    return torch.stack(
        [
            torch.div(height - crop_h, 2, rounding_mode="floor"),
            torch.div(width - crop_w, 2, rounding_mode="floor"),
            crop_h,
            crop_w,
        ],
        dim=1,
    )


def crop_and_resize(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Cut each box out of its image and resample it to ``size`` × ``size`` px.

    Args:
        images: (B, H, W, 3) uint8 RGB, each image in the top-left corner of its (H, W) canvas with
            its last row and column repeated into the padding (so that bilinear samples at an image's
            edge never see the padding).
        boxes: (B, 4) int64 top, left, height, width (px).
        size: output side (px).

    Returns:
        (B, 3, size, size) float32 in [0, 1], on the images' device.
    """
    with torch.no_grad():
        planar = images.permute(0, 3, 1, 2).float()
        top, left, height, width = boxes.to(device=images.device, dtype=torch.float32, non_blocking=True).unbind(1)
        batch_index = torch.arange(len(images), device=images.device, dtype=torch.float32)
        rois = torch.stack([batch_index, left, top, left + width, top + height], dim=1)
        crops = torch.ops.torchvision.roi_align(planar, rois, 1.0, size, size, ADAPTIVE_SAMPLING, True)
    return crops.div_(255.0)


def augment_batch(
    images: torch.Tensor,
    sizes: torch.Tensor,
    train_crop: int,
    scale: Sequence[float],
    flip: bool,
    generator: torch.Generator,
) -> torch.Tensor:
    """Random resized crop to ``train_crop`` px, a random horizontal flip when ``flip``, and scaling to [0, 1].

    Args:
        images: (B, H, W, 3) uint8 padded batch (:func:`crop_and_resize`), on the training device.
        sizes: (B, 2) int64 true height and width of each image (px).
        train_crop: output side (px).
        scale: area share of the crops (``training.image.crop_scale``).
        flip: whether to flip (``training.image.flip``).
        generator: CPU generator of the boxes and flips.

    Returns:
        (B, 3, train_crop, train_crop) float32 in [0, 1].
    """
    boxes = random_resized_boxes(sizes, scale, generator)
    crops = crop_and_resize(images, boxes, train_crop)
    if not flip:
        return crops
    flipped = (torch.rand(len(images), generator=generator) < 0.5).to(crops.device, non_blocking=True)
    return torch.where(flipped[:, None, None, None], crops.flip(-1), crops)
