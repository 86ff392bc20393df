"""Optimiser and learning-rate schedule from the ``training.optimizer`` / ``training.schedule`` params."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "radam": torch.optim.RAdam,
}


def parameter_groups(config: Mapping[str, Any], model: nn.Module, loss: nn.Module) -> list[dict[str, Any]]:
    """Three groups with their own learning rates: the backbone (``lr``), every other parameter
    of the model, such as embedding heads and attention modules (``lr × head_lr_multiplier``),
    and loss parameters such as proxies (``lr × loss_lr_multiplier``).

    The backbone group holds ``model.backbone`` (one StagedBackbone or a ModuleList of them)
    and, for a model that trains its own copies of backbone stages (ABE's attention trunk,
    M-heads' extra heads, DIABLO's φ), the modules its ``backbone_copies()`` returns: copies
    initialised from pretrained stages are fine-tuned as backbone layers.
    Frozen parameters are left out; empty groups are dropped.
    """
    lr = config["lr"]
    copies = model.backbone_copies() if hasattr(model, "backbone_copies") else []
    backbone = [p for module in (model.backbone, *copies) for p in module.parameters()]
    backbone_ids = {id(p) for p in backbone}
    rest = [p for p in model.parameters() if id(p) not in backbone_ids]
    groups = [
        {"name": "backbone", "params": backbone, "lr": lr},
        {"name": "head", "params": rest, "lr": lr * config.get("head_lr_multiplier", 1.0)},
        {"name": "loss", "params": list(loss.parameters()), "lr": lr * config.get("loss_lr_multiplier", 1.0)},
    ]
    for group in groups:
        group["params"] = [p for p in group["params"] if p.requires_grad]
    return [g for g in groups if g["params"]]


def build_optimizer(config: Mapping[str, Any], model: nn.Module, loss: nn.Module) -> torch.optim.Optimizer:
    """``training.optimizer``: ``name`` (sgd, adam, adamw, radam), ``lr``, ``weight_decay``,
    optional ``momentum`` (sgd), ``head_lr_multiplier``, ``loss_lr_multiplier``."""
    name = config["name"]
    if name not in OPTIMIZERS:
        raise ValueError(f"training.optimizer.name = {name!r} is unknown; known: {sorted(OPTIMIZERS)}")
    kwargs: dict[str, Any] = {"lr": config["lr"], "weight_decay": config.get("weight_decay", 0.0)}
    if name == "sgd":
        kwargs["momentum"] = config.get("momentum", 0.9)
    return OPTIMIZERS[name](parameter_groups(config, model, loss), **kwargs)


def build_scheduler(config: Mapping[str, Any], optimizer: torch.optim.Optimizer, epochs: int) -> torch.optim.lr_scheduler.LRScheduler:
    """``training.schedule``, stepped once per epoch: ``constant``; ``step`` (``milestones`` in
    epochs, ``gamma``); ``cosine`` (to ``min_lr_fraction`` × lr over ``epochs``)."""
    name = config["name"]
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if name == "step":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, config["milestones"], gamma=config.get("gamma", 0.1))
    if name == "cosine":
        floor = config.get("min_lr_fraction", 0.0)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda e: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * e / epochs))
        )
    raise ValueError(f"training.schedule.name = {name!r} is unknown; known: constant, step, cosine")
