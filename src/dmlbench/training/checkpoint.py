"""Checkpoint files: atomic writes, safe loads (``weights_only=True``), and the data they were trained on.

A resume checkpoint and a run's ``checkpoint.pt`` record the manifest the run was trained on
(:data:`MANIFEST_KEY`, its path) and the SHA-256 of that file's bytes (:data:`MANIFEST_DIGEST_KEY`):
``prepare`` writes a dataset's manifest byte for byte the same each time, so equal bytes mean the
same images, labels and splits. Resume and embed refuse another manifest
(:func:`check_manifest`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dmlbench.atomic import atomic_output
from dmlbench.errors import DmlbenchError
from dmlbench.models.backbones.weights import sha256_of


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to a temporary file in the same directory, then rename over ``path``."""
    with atomic_output(path) as tmp:
        torch.save(obj, tmp)


class CheckpointError(DmlbenchError, ValueError):
    """A checkpoint file cannot be read; the message names it and what to do."""


#: entries of a finished run's ``checkpoint.pt`` that every reader needs.
RUN_CHECKPOINT_KEYS = ("run", "model")
#: entries of a resume checkpoint (``.scratch/…/last.pt``) checked before it is trusted.
RESUME_CHECKPOINT_KEYS = ("digest", "epoch")
#: checkpoint entry: the path of the manifest the run was trained on (as it was given).
MANIFEST_KEY = "manifest"
#: checkpoint entry: the SHA-256 (hex) of that manifest file's bytes.
MANIFEST_DIGEST_KEY = "manifest_sha256"
#: hex digits of a digest shown in messages.
SHOWN_DIGEST_CHARS = 12


class ManifestMismatchError(CheckpointError):
    """A checkpoint is used with another dataset's manifest than the one it was trained on."""


def load_checkpoint(
    path: str | os.PathLike[str],
    remedy: str = "re-create it with `dmlbench train`",
    required: tuple[str, ...] = RUN_CHECKPOINT_KEYS,
) -> dict[str, Any]:
    """Load a checkpoint written by this project, tensors and plain Python types only.

    Args:
        remedy: what the error message tells the user to do with an unreadable file.
        required: top-level entries the file must have (a dict); a file without them is a CheckpointError.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found; run `dmlbench train` for this run first")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for corrupt or foreign files
        raise CheckpointError(
            f"{path}: not a readable dmlbench checkpoint ({type(err).__name__}: {err}); {remedy}"
        ) from err
    missing = list(required) if not isinstance(checkpoint, dict) else [k for k in required if k not in checkpoint]
    if missing:
        found = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(
            f"{path}: not a dmlbench checkpoint: no {', '.join(repr(k) for k in missing)} "
            f"entry (found {found}); {remedy}"
        )
    return checkpoint


def config_digest(run: Mapping[str, Any]) -> str:
    """SHA-256 of the resolved run configuration (key order independent)."""
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()


def manifest_entries(manifest: str | os.PathLike[str]) -> dict[str, str]:
    """The checkpoint entries that record the manifest a run trains on: its path and its bytes' SHA-256."""
    return {MANIFEST_KEY: str(manifest), MANIFEST_DIGEST_KEY: sha256_of(Path(manifest))}


def check_manifest(
    checkpoint: Mapping[str, Any],
    path: str | os.PathLike[str],
    manifest: str | os.PathLike[str],
    retry: str,
    restart: str,
) -> None:
    """Refuse to use ``checkpoint`` (read from ``path``) with data from ``manifest`` unless the checkpoint
    was trained on a manifest with the same bytes.

    A checkpoint written before manifests were recorded (no :data:`MANIFEST_DIGEST_KEY` entry) passes:
    there is nothing to compare, and such runs keep embedding as before.

    Args:
        retry: the command to repeat with the recorded manifest (e.g. ``"embed it"``).
        restart: the other way out, with ``manifest`` (e.g. ``"train the run again on it"``).

    Raises:
        ManifestMismatchError: naming both manifests, their digests and both ways out.
    """
    recorded = checkpoint.get(MANIFEST_DIGEST_KEY)
    if recorded is None:
        return
    actual = sha256_of(Path(manifest))
    if actual != recorded:
        trained_on = checkpoint.get(MANIFEST_KEY, "another manifest")
        raise ManifestMismatchError(
            f"{path} was trained on {trained_on} (sha256 {recorded[:SHOWN_DIGEST_CHARS]}…), but {manifest} holds "
            f"other data (sha256 {actual[:SHOWN_DIGEST_CHARS]}…): {retry} with --manifest {trained_on}, "
            f"or {restart}"
        )
