"""Seeds: every random draw of a run is a function of (run seed, epoch)."""

from __future__ import annotations

import hashlib
import os
import random

import numpy as np
import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from any tuple of ints/strings, stable across processes and Python versions.

    >>> derive_seed(0, 1) == derive_seed(0, 1) != derive_seed(1, 0)
    True
    """
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_determinism(deterministic: bool, device: torch.device) -> None:
    """``training.deterministic`` on a GPU: deterministic cuDNN and torch kernels (no autotuning), or
    cuDNN's autotuned, possibly non-deterministic, fastest kernels. A CPU run is deterministic either
    way, so nothing changes there.

    An operation without a deterministic GPU kernel warns instead of failing
    (``warn_only=True``): the run goes on, and its log names the operation.
    """
    if device.type != "cuda":
        return
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic GEMMs
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)


def ran_deterministically(deterministic: bool, device: str) -> bool:
    """Whether a run on ``device`` (``"cpu"``, ``"cuda:0"``, …) with ``training.deterministic`` set so used only
    deterministic kernels.

    >>> ran_deterministically(False, "cpu"), ran_deterministically(False, "cuda:0")
    (True, False)
    """
    return device.startswith("cpu") or deterministic
