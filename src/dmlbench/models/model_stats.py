"""Size and cost of a model at test time: parameters and forward FLOPs per image."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model`` (trainable or not; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def forward_gflops(model: nn.Module, image_size: int) -> float:
    """GFLOPs of one forward pass of one (3, ``image_size``, ``image_size``) image in eval mode.

    Counted by :class:`torch.utils.flop_counter.FlopCounterMode` on the CPU (a multiply-add
    counts as 2 FLOPs; element-wise operations are not counted, as in the papers' tables).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.zeros(1, 3, image_size, image_size, device=device))
    model.train(was_training)
    return counter.get_total_flops() / 1e9
