"""A torch Dataset over manifest rows: reads image files, applies a transform."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from dmlbench.data.images import load_rgb


class ImageDataset(Dataset):
    """Images from file paths with integer labels.

    Items are ``(image, label, index)``: ``image`` is whatever ``transform``
    returns (normally a float tensor (3, H, W)), ``label`` an int64 tensor,
    ``index`` the row position (used to write embeddings in manifest order).
    Greyscale, palette and CMYK files are converted to RGB (:func:`load_rgb`).
    With ``cache=True`` each decoded image is kept in memory after its first
    read (worth it for small datasets such as ``synthetic``: decoding is a
    third of the CPU time of an epoch there).

    The loader interface it shares with :class:`dmlbench.data.stored_dataset.StoredImageDataset`:
    :attr:`collate_fn` (None: torch's default), :attr:`random_in_workers`, :meth:`to_model_input` (here the
    identity: the transform already gave model inputs) and :meth:`evaluation_view`.
    """

    #: How a loader batches the items (None: torch's default collate).
    collate_fn: Callable[[list[Any]], Any] | None = None
    #: The transform draws its random crops and flips in the loader's workers (so they are seeded per epoch).
    random_in_workers = True

    def __init__(
        self,
        paths: Sequence[str],
        labels: np.ndarray,
        transform: Callable[[Image.Image], torch.Tensor],
        cache: bool = False,
    ):
        if len(paths) != len(labels):
            raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
        self.paths = list(paths)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.cache: dict[int, Image.Image] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.paths)

    def with_transform(self, transform: Callable[[Image.Image], torch.Tensor]) -> "ImageDataset":
        """The same rows with another transform, sharing the decoded-image cache."""
        twin = ImageDataset(self.paths, self.labels, transform)
        twin.cache = self.cache
        return twin

    def evaluation_view(self, test: "ImageDataset") -> "ImageDataset":
        """These rows as evaluation delivers them: ``test``'s (deterministic) transform."""
        return self.with_transform(test.transform)

    def to_model_input(
        self, images: torch.Tensor, indices: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A loader batch, already on the device, as the model takes it: here unchanged, (B, 3, H, W) float."""
        return images

    def _image(self, index: int) -> Image.Image:
        if self.cache is not None and index in self.cache:
            return self.cache[index]
        try:
            rgb = load_rgb(self.paths[index])
        except (OSError, ValueError) as err:
            raise OSError(f"cannot read image {self.paths[index]}: {err}") from err
        if self.cache is not None:
            self.cache[index] = rgb
        return rgb

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.transform(self._image(index)), torch.tensor(self.labels[index]), index
