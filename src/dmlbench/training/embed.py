"""The embed step: a trained run's test embeddings, written as an ``.npz`` for evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dmlbench.atomic import atomic_output

from dmlbench.methods import build_recipe
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.data import load_run_data
from dmlbench.training.embedding import compute_embeddings
from dmlbench.training.trainer import resolve_device


def write_npz(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez`` to a temporary file, then rename over ``path``."""
    with atomic_output(path) as tmp:
        np.savez(tmp, **arrays)


def embed_run(checkpoint_path: str | Path, manifest_path: str | Path, out_path: str | Path) -> Path:
    """Embed the test images (or query + gallery) of a trained run.

    Writes ``embeddings`` (N, d) float32, ``labels`` (N,) int64, ``split`` (N,)
    when the dataset is query/gallery, and ``learner_slices`` (M, 2) [start, stop)
    for multi-learner models.
    """
    checkpoint = load_checkpoint(checkpoint_path)
    run = checkpoint["run"]
    model = build_recipe(run).build_model()
    model.load_state_dict(checkpoint["model"])
    device = resolve_device(run["training"]["device"])
    data = load_run_data(run, manifest_path)
    embeddings = compute_embeddings(model.to(device), data.test, run["training"]["eval_batch_size"], device)
    arrays: dict[str, np.ndarray] = {"embeddings": embeddings, "labels": data.test.labels}
    if set(data.test_split) != {"test"}:
        arrays["split"] = data.test_split.astype(str)
    if model.learner_slices:
        arrays["learner_slices"] = np.asarray(model.learner_slices, dtype=np.int64)
    out_path = Path(out_path)
    write_npz(out_path, **arrays)
    return out_path
