"""The embed step: a trained run's test embeddings, written as an ``.npz`` for evaluation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dmlbench.atomic import write_npz_atomic
from dmlbench.config import ConfigError
from dmlbench.methods import build_recipe
from dmlbench.methods.checkpoint_reuse import training_differences
from dmlbench.placement import claim_device, gpu_index
from dmlbench.training.checkpoint import CheckpointError, check_manifest, load_checkpoint
from dmlbench.training.data import load_run_data
from dmlbench.models.model_stats import count_parameters, forward_gflops
from dmlbench.seeding import configure_determinism, ran_deterministically
from dmlbench.training.trainer import place_model, resolve_device


def reuse_differences(trained: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """Keys where ``run`` would train differently from the run a checkpoint was trained as (both
    :func:`~dmlbench.config.resolve_run` dicts): its dataset, seed, method section or training settings,
    apart from names and the recipe's test-time options (:func:`~dmlbench.methods.checkpoint_reuse.training_differences`)."""

    def trained_as(r: Mapping[str, Any]) -> dict[str, Any]:
        return {**r["method_config"], "training": r["training"]}

    return [key for key in ("dataset", "seed") if trained[key] != run[key]] + training_differences(
        trained_as(trained), trained_as(run)
    )


def embed_run(
    checkpoint_path: str | Path, manifest_path: str | Path, out_path: str | Path, run: Mapping[str, Any] | None = None
) -> Path:
    """Embed the test images (or query + gallery) of a trained run with its recipe's test-time embedding.

    ``run`` (default: the run stored in the checkpoint) is the resolved run whose test-time options
    embed: another method's run that re-embeds this checkpoint (``checkpoint_of``) and differs from
    the stored one only in test-time options (:func:`reuse_differences`; else a ConfigError).

    Writes ``embeddings`` (N, d) float32, ``labels`` (N,) int64, ``split`` (N,)
    when the dataset is query/gallery, ``learner_slices`` (M, 2) [start, stop)
    for multi-learner models, the recipe's named views (``view_names``,
    ``view_slices``), and stats (``stat_names``, ``stat_values``):
    ``num_parameters``, ``gflops`` (per test image), ``deterministic`` (1 when the training run used
    only deterministic kernels: on the CPU, or with ``training.deterministic`` on a GPU),
    ``training_gpu`` (the CUDA device index the run trained on, -1 on the CPU) and the recipe's
    training summary.

    The checkpoint's recorded manifest (:func:`~dmlbench.training.checkpoint.check_manifest`) must have the
    bytes of ``manifest_path``, else a ManifestMismatchError; a checkpoint written before manifests were
    recorded has none and embeds with any manifest, as it did then.
    """
    checkpoint = load_checkpoint(checkpoint_path)
    trained = checkpoint["run"]
    run = trained if run is None else run
    differences = reuse_differences(trained, run)
    if differences:
        raise ConfigError(
            f"{checkpoint_path} was trained as {trained['method']}; {run['method']} differs from it in "
            f"{differences}, which change the training, so it cannot re-embed this checkpoint: "
            f"train {run['method']} itself"
        )
    recipe = build_recipe(run)
    model = recipe.build_model()
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as err:
        raise CheckpointError(
            f"{checkpoint_path}: its weights do not fit {run['method']}'s model (the code or the "
            f"configuration changed since it was trained?): {str(err)[:500]}. Train the run "
            f"again to re-create it"
        ) from err
    check_manifest(
        checkpoint, checkpoint_path, manifest_path, retry="embed it", restart=f"train the run again on {manifest_path}"
    )
    data = load_run_data(run, manifest_path)
    settings = recipe.settings
    with claim_device(settings.device) as name:  # its own GPU slot when several GPUs are shared
        device = resolve_device(name)
        configure_determinism(settings.deterministic, device)
        model = place_model(model, settings.channels_last, device)
        embeddings = recipe.embed(model, data.test, settings.eval_batch_size, device, settings.num_workers)
    arrays: dict[str, np.ndarray] = {"embeddings": embeddings, "labels": data.test.labels}
    if set(data.test_split) != {"test"}:
        arrays["split"] = data.test_split.astype(str)
    if getattr(model, "learner_slices", None):
        arrays["learner_slices"] = np.asarray(model.learner_slices, dtype=np.int64)
    views = recipe.embedding_views(model)
    if views:
        arrays["view_names"] = np.asarray(list(views), dtype=str)
        arrays["view_slices"] = np.asarray(list(views.values()), dtype=np.int64)
    trained_on = checkpoint.get("device", "cpu")
    stats = {
        "num_parameters": float(count_parameters(model)),
        "gflops": forward_gflops(model, settings.image.test_crop),
        "deterministic": float(
            ran_deterministically(settings.deterministic, trained_on) and not checkpoint.get("nondeterministic_ops")
        ),
        "training_gpu": float(gpu_index(trained_on)),
        **checkpoint.get("summary", {}),
    }
    arrays["stat_names"] = np.asarray(list(stats), dtype=str)
    arrays["stat_values"] = np.asarray(list(stats.values()), dtype=np.float64)
    out_path = Path(out_path)
    write_npz_atomic(out_path, **arrays)
    return out_path
