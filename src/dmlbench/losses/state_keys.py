"""Loading a loss's state saved under earlier parameter names.

The margin and normalised-softmax losses once held their parameters in a wrapped
pytorch-metric-learning module (``pml_loss.beta``, ``pml_loss.W``); a resume checkpoint
written then still names them so. :func:`rename_state_keys_on_load` lets such a state load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

__all__ = ["rename_state_keys_on_load"]


def rename_state_keys_on_load(module: nn.Module, renames: Mapping[str, str]) -> None:
    """Make ``module.load_state_dict`` accept each old key of ``renames`` as its new key.

    Args:
        module: the module whose state is loaded (the keys are relative to it).
        renames: old key -> new key, e.g. ``{"pml_loss.W": "weight"}``.

    >>> import torch
    >>> layer = nn.Linear(1, 1, bias=False)
    >>> rename_state_keys_on_load(layer, {"old.w": "weight"})
    >>> _ = layer.load_state_dict({"old.w": torch.full((1, 1), 3.0)})
    >>> layer.weight.item()
    3.0
    """

    def rename(_module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
        for old, new in renames.items():
            if prefix + old in state and prefix + new not in state:
                state[prefix + new] = state.pop(prefix + old)

    module.register_load_state_dict_pre_hook(rename)
