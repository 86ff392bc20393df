"""Shared fixtures: a tiny image dataset on disk and a tiny resolved run."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from dmlbench.config import resolve_run
from dmlbench.data.manifest import write_manifest
from dmlbench.params import load_config
from dmlbench.settings import OptimizerSettings
from dmlbench.training.optim import parameter_groups

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(root: Path) -> Path:
    """``root`` with a copy of the workflow and its parameters (no data, no results), where ``snakemake -n``
    runs without touching the repository's ``.snakemake/``, ``data/`` or ``results/``."""
    for name in ("Snakefile", "workflow", "params.yaml"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / name)
    return root


def write_tiny_dataset(root: Path, num_classes: int = 8, per_class: int = 6, size: int = 24, seed: int = 0) -> Path:
    """Coloured-square images: class c = a colour and a position; half the classes train, half test.

    Returns the manifest path.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for label in range(num_classes):
        colour = rng.integers(40, 255, size=3)
        corner = rng.integers(0, size // 2, size=2)
        for i in range(per_class):
            pixels = rng.integers(0, 60, size=(size, size, 3)).astype(np.uint8)
            y, x = corner + rng.integers(-2, 3, size=2).clip(0)
            pixels[y : y + size // 2, x : x + size // 2] = colour
            path = root / "images" / f"{label}_{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(path)
            rows.append(
                {
                    "path": f"images/{label}_{i}.png",
                    "label": label,
                    "class_name": f"c{label}",
                    "split": "train" if label < num_classes // 2 else "test",
                }
            )
    return write_manifest(pd.DataFrame(rows), root / "manifest.csv")


@pytest.fixture(autouse=True)
def image_store_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded-image stores (training.pipeline: decoded_uint8) go to a temporary folder, not .scratch/."""
    monkeypatch.setenv("DMLBENCH_IMAGE_STORE", str(tmp_path_factory.getbasetemp() / "image_store"))


@pytest.fixture
def tiny_manifest(tmp_path: Path) -> Path:
    return write_tiny_dataset(tmp_path / "tiny", num_classes=12)


@pytest.fixture
def params() -> dict:
    return load_config([REPO / "params.yaml"])


def tiny_run(params: dict, method: str = "triplet", seed: int = 0, epochs: int = 3) -> dict:
    """A resolved run shrunk to seconds: tiny images, width-4 CNN from random weights, 2 batches per epoch."""
    run = resolve_run(params, "synthetic", method, seed)
    run = copy.deepcopy(run)
    training = run["training"]
    training.update(epochs=epochs, val_fraction=0.34, device="cpu", embedding_dim=8, eval_batch_size=16)
    training["backbone"].update(width=4, pretrained=None)  # no pretraining-stage file in unit tests
    training["image"].update(resize=24, test_crop=20, train_crop=20)
    training["sampler"].update(classes_per_batch=3, images_per_class=3, batches_per_epoch=2)
    return run


def parameter_group_ids(model: torch.nn.Module) -> dict[str, set[int]]:
    """The optimiser's parameter groups of ``model`` (no loss parameters): group name → parameter ids."""
    settings = OptimizerSettings(name="adam", lr=1.0, head_lr_multiplier=10.0)
    groups = parameter_groups(settings, model, torch.nn.Module())
    return {group["name"]: {id(p) for p in group["params"]} for group in groups}
