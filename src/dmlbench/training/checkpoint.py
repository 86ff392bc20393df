"""Checkpoint files: atomic writes, safe loads (``weights_only=True``)."""

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


def load_checkpoint(path: str | os.PathLike[str], remedy: str = "re-create it with `dmlbench train`",
                    required: tuple[str, ...] = RUN_CHECKPOINT_KEYS) -> dict[str, Any]:
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
            f"{path}: not a readable dmlbench checkpoint ({type(err).__name__}: {err}); {remedy}") from err
    missing = list(required) if not isinstance(checkpoint, dict) else [k for k in required if k not in checkpoint]
    if missing:
        found = sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(f"{path}: not a dmlbench checkpoint: no {', '.join(repr(k) for k in missing)} "
                              f"entry (found {found}); {remedy}")
    return checkpoint


def config_digest(run: Mapping[str, Any]) -> str:
    """SHA-256 of the resolved run configuration (key order independent)."""
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode()).hexdigest()
