"""The pretraining stage: a backbone trained by classification on a dataset's pretraining classes.

The papers fine-tune an ImageNet-pretrained backbone; the embedded default gets the same regime
offline from the synthetic dataset's ``pretrain_classes`` (disjoint from the benchmark's train and
test classes). ``params.yaml``'s ``pretraining.<dataset>`` names the run:

- ``method``: an entry of ``methods`` (a classification loss such as ``norm_softmax``, whose
  backbone must say ``pretrained: null``), trained like any run (resumable, deterministic,
  epoch selected on its validation classes) on ``data/prepared/<dataset>/pretrain.csv``;
- ``seed``: its seed.

Outputs, under ``data/pretrained/<dataset>/``: ``<backbone>_run/`` (the run's ``checkpoint.pt``
and ``log.csv``), ``<backbone>.pt`` (the selected epoch's backbone ``body`` state dict, what
``training.backbone.pretrained: <dataset>`` loads) and ``<backbone>.pt.sha256``, written last.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dmlbench.atomic import atomic_output
from dmlbench.config import ConfigError, resolve_run
from dmlbench.data.synthetic import PRETRAIN_MANIFEST_FILE
from dmlbench.layout import CHECKPOINT_FILE, pretrained_path, pretraining_run_dir
from dmlbench.models.backbones.weights import sha256_of, sha256_sidecar
from dmlbench.settings import training_settings
from dmlbench.training.checkpoint import atomic_torch_save, load_checkpoint
from dmlbench.training.trainer import train_run

#: Prefix of the backbone's body parameters in a trained model's state dict.
BODY_PREFIX = "backbone.body."


def pretraining_run(config: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """The resolved run of ``pretraining.<dataset>``.

    Raises:
        ConfigError: no such section, or its method starts from pretrained weights itself.
    """
    section = config.get("pretraining", {}).get(dataset)
    if section is None:
        known = sorted(config.get("pretraining", {}))
        raise ConfigError(
            f"params: pretraining.{dataset} is not set (pretraining stages: {known}); add "
            f"`pretraining: {{{dataset}: {{method: ..., seed: 0}}}}`"
        )
    run = resolve_run(config, dataset, section["method"], int(section["seed"]))
    if training_settings(run).backbone.pretrained:
        raise ConfigError(
            f"params: methods.{section['method']} (pretraining.{dataset}.method) must train its "
            f"backbone from scratch: set training.backbone.pretrained: null in that entry"
        )
    return run


def backbone_state(model_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The backbone ``body`` tensors of a trained model's state dict, prefix removed.

    >>> sorted(backbone_state({"backbone.body.stem.0.weight": torch.zeros(1), "head.linear.bias": torch.zeros(1)}))
    ['stem.0.weight']
    """
    state = {k[len(BODY_PREFIX) :]: v for k, v in model_state.items() if k.startswith(BODY_PREFIX)}
    if not state:
        raise ValueError(f"the model has no parameters under {BODY_PREFIX!r}: not a backbone + head model")
    return state


def pretrain_backbone(
    config: Mapping[str, Any],
    dataset: str,
    prepared_dir: str | Path,
    out_root: Path | None = None,
    scratch_dir: str | Path | None = None,
    progress: bool = False,
) -> Path:
    """Train ``pretraining.<dataset>``'s run and export its backbone; returns the weights file.

    Args:
        config: the parameters (params.yaml + overlays).
        dataset: the dataset whose prepared folder holds ``pretrain.csv``.
        prepared_dir: ``data/prepared/<dataset>``.
        out_root: folder for the outputs (default ``data/pretrained/<dataset>``, where
            ``pretrained: <dataset>`` looks).
        scratch_dir: resume checkpoints (default ``.scratch/<out_root>/<backbone>_run``).
        progress: show a progress bar.
    """
    run = pretraining_run(config, dataset)
    manifest = Path(prepared_dir) / PRETRAIN_MANIFEST_FILE
    if not manifest.is_file():
        raise ConfigError(
            f"{manifest}: not found; the pretraining stage needs the dataset's pretraining classes: "
            f"set datasets.{dataset}.pretrain_classes (e.g. 100) and prepare it again"
        )
    weights = pretrained_path(dataset, training_settings(run).backbone.name)
    if out_root is not None:
        weights = Path(out_root) / weights.name
    run_dir = pretraining_run_dir(weights)
    sidecar = sha256_sidecar(weights)
    sidecar.unlink(missing_ok=True)
    train_run(run, manifest, run_dir, scratch_dir or Path(".scratch") / run_dir, progress=progress)
    atomic_torch_save(backbone_state(load_checkpoint(run_dir / CHECKPOINT_FILE)["model"]), weights)
    with atomic_output(sidecar) as tmp:
        Path(tmp).write_text(sha256_of(weights) + "\n")
    return weights
