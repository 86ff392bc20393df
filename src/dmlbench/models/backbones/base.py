"""Backbones as ordered, named stages (DESIGN.md, "cut points").

A method never asks for layer indices: it asks for "the features after stage
X" (:meth:`StagedBackbone.forward` with ``until``) or "the stages from X to Y"
(:meth:`StagedBackbone.stages`). The last stage is always ``pool``, which maps
a feature map (B, C, H, W) to a vector (B, C).

Input convention: every backbone takes RGB tensors in [0, 1] of shape
(B, 3, H, W) and applies its own normalisation first (its ``normalize``
module), so data transforms are the same for all backbones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn


class InputNormalization(nn.Module):
    """(x − mean) / std per channel, for RGB inputs in [0, 1]; buffers, not parameters."""

    mean: torch.Tensor  # (1, 3, 1, 1) buffer
    std: torch.Tensor  # (1, 3, 1, 1) buffer

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class GlobalPool(nn.Module):
    """Global average or max pooling: (B, C, H, W) → (B, C)."""

    def __init__(self, mode: str = "avg"):
        super().__init__()
        if mode not in ("avg", "max"):
            raise ValueError(f"training.backbone.pooling must be 'avg' or 'max', got {mode!r}")
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(dim=(2, 3)) if self.mode == "max" else x.mean(dim=(2, 3))


class StagedBackbone(nn.Module):
    """A network as an ordered dict of named stages ending in ``pool``.

    Args:
        normalize: applied to the [0, 1] RGB input before the first stage.
        stages: ordered ``name → module``; the last must be named ``pool``.
        out_channels: channels produced by each stage (``pool`` included).
    """

    def __init__(self, normalize: nn.Module, stages: "OrderedDict[str, nn.Module]", out_channels: dict[str, int]):
        super().__init__()
        names = list(stages)
        if not names or names[-1] != "pool":
            raise ValueError(f"the last stage must be 'pool', got {names}")
        if set(out_channels) != set(names):
            raise ValueError(f"out_channels must name every stage: {names}")
        self.normalize = normalize
        self.body = nn.ModuleDict(stages)
        self.stage_names: tuple[str, ...] = tuple(names)
        self.out_channels = dict(out_channels)
        self.frozen_stages: tuple[str, ...] = ()

    def freeze_through(self, name: str) -> None:
        """Fix the input normalisation and every stage up to and including ``name``.

        Their parameters stop requiring gradients, so autograd records nothing there
        (no backward pass and no saved activations below the first trainable stage),
        and :meth:`train` keeps them in eval mode. A method's copies of stages made
        after this call (ABE's attention trunk, DIABLO's φ) copy the frozen flag too.
        """
        if name == "pool":
            raise ValueError(
                "training.backbone.frozen_through: 'pool' would freeze the whole backbone; "
                f"name a stage before it: {list(self.stage_names[:-1])}"
            )
        self.frozen_stages = self.stage_names[: self.index(name) + 1]
        for module in (self.normalize, *(self.body[n] for n in self.frozen_stages)):
            for p in module.parameters():
                p.requires_grad_(False)
        self.train(self.training)

    def train(self, mode: bool = True) -> "StagedBackbone":
        super().train(mode)
        for name in self.frozen_stages:
            self.body[name].eval()
        return self

    def index(self, name: str) -> int:
        """Position of stage ``name``; a clear error lists the valid names."""
        if name not in self.stage_names:
            raise KeyError(f"backbone has no stage {name!r}; stages are {list(self.stage_names)}")
        return self.stage_names.index(name)

    def stages(self, after: str | None, until: str) -> nn.Sequential:
        """The stages strictly after ``after`` (None = from the start) up to and including ``until``.

        The modules are shared with this backbone (no copy): a method that needs
        its own copy (e.g. ABE's attention trunk) deep-copies the result.
        """
        start = 0 if after is None else self.index(after) + 1
        stop = self.index(until) + 1
        if start >= stop:
            raise ValueError(f"empty stage range: after {after!r} until {until!r}")
        return nn.Sequential(OrderedDict((n, self.body[n]) for n in self.stage_names[start:stop]))

    def forward(self, x: torch.Tensor, until: str = "pool") -> torch.Tensor:
        """Run from the normalised input through stage ``until``.

        Args:
            x: (B, 3, H, W) RGB in [0, 1].

        Returns:
            (B, C, h, w) feature map, or (B, C) when ``until == 'pool'``.
        """
        last = self.index(until)
        x = self.normalize(x)
        for name in self.stage_names[: last + 1]:
            x = self.body[name](x)
        return x

    @torch.no_grad()
    def stage_shapes(self, image_size: int) -> "OrderedDict[str, tuple[int, ...]]":
        """Output shape (without batch) of every stage for a square input of ``image_size`` px."""
        was_training = self.training
        self.eval()
        x = self.normalize(torch.zeros(1, 3, image_size, image_size))
        shapes: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        for name in self.stage_names:
            x = self.body[name](x)
            shapes[name] = tuple(x.shape[1:])
        self.train(was_training)
        return shapes


def freeze_batchnorm(module: nn.Module) -> None:
    """Put every BatchNorm in eval mode and stop its affine parameters from training.

    Call after ``module.train()``: the trainer re-applies it at each epoch start.
    """
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
