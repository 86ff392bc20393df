"""Embedding a set of images with a trained model (no gradient, test transform)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from dmlbench.data.stored_dataset import ImageSet


@torch.no_grad()
def compute_embeddings(
    model: nn.Module, dataset: ImageSet, batch_size: int, device: torch.device, num_workers: int = 0
) -> np.ndarray:
    """Embeddings of every item of ``dataset``, in dataset order (evaluation items: test transform or centre crops).

    Args:
        num_workers: loader processes decoding images (``training.num_workers``); 0 decodes in this
            process. Batches are pinned in memory when ``device`` is a GPU.

    Returns:
        (N, d) float32 array.
    """
    was_training = model.training
    model.eval()
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        collate_fn=dataset.collate_fn,
    )
    chunks = []
    for images, _, indices in loader:
        inputs = dataset.to_model_input(images.to(device, non_blocking=True), indices)
        with torch.autocast(device.type, enabled=device.type == "cuda"):
            chunks.append(model(inputs).float().cpu())
    model.train(was_training)
    return torch.cat(chunks).numpy().astype(np.float32, copy=False)
