"""Optimiser and learning-rate schedule from the ``training.optimizer`` / ``training.schedule`` params."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from dmlbench.settings import OptimizerSettings, ScheduleSettings

OPTIMIZERS = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "radam": torch.optim.RAdam,
}

#: Optimisers that take every parameter's update in one fused CUDA kernel. Beyond speed, a fused
#: optimiser applies AMP's loss scaling inside its kernel, so ``GradScaler.step`` does not read the
#: inf/NaN flag back to the host: a training step never waits for the GPU (the CPU queues the next
#: batch while the GPU works). On the CPU the default implementation is kept (its numbers are the
#: reference ones).
FUSED_ON_CUDA = ("sgd", "adam", "adamw")


def multiplier_groups(owner: nn.Module, parent: dict[str, Any]) -> list[dict[str, Any]]:
    """Split the groups named by ``owner.parameter_group_multipliers()`` out of ``parent``.

    The optional hook returns ``{name: (module, multiplier)}``: the parameters of ``module`` leave the
    parent group and form the group ``<parent name>/<name>`` with ``lr = parent lr × multiplier``
    (e.g. the MPN's attention at 10 × the head's lr). Parameters of ``module`` that are not in the
    parent group (frozen, backbone, or taken by an earlier entry) stay where they are.

    Returns:
        The new groups (possibly empty); ``parent["params"]`` loses their parameters.

    Raises:
        ValueError: a multiplier ≤ 0.
    """
    hook = getattr(owner, "parameter_group_multipliers", None)
    if hook is None:
        return []
    remaining = {id(p): p for p in parent["params"]}
    groups = []
    for name, (module, multiplier) in hook().items():
        if multiplier <= 0:
            raise ValueError(f"parameter group {parent['name']}/{name}: lr multiplier must be > 0, got {multiplier}")
        params = [p for p in module.parameters() if id(p) in remaining]
        for p in params:
            del remaining[id(p)]
        groups.append({"name": f"{parent['name']}/{name}", "params": params, "lr": parent["lr"] * multiplier})
    parent["params"] = list(remaining.values())
    return groups


def parameter_groups(settings: OptimizerSettings, model: nn.Module, loss: nn.Module) -> list[dict[str, Any]]:
    """Three groups with their own learning rates: the backbone (``lr``), every other parameter
    of the model, such as embedding heads and attention modules (``lr × head_lr_multiplier``),
    and loss parameters such as proxies (``lr × loss_lr_multiplier``).

    The backbone group holds ``model.backbone`` (one StagedBackbone or a ModuleList of them)
    and, for a model that trains its own copies of backbone stages (ABE's attention trunk,
    M-heads' extra heads, DIABLO's φ), the modules its ``backbone_copies()`` returns: copies
    initialised from pretrained stages are fine-tuned as backbone layers.
    A model (or loss) with ``parameter_group_multipliers()`` splits parts of its ``head`` (``loss``)
    group into groups of their own with a multiple of that group's lr (:func:`multiplier_groups`).
    Frozen parameters are left out; empty groups are dropped.
    """
    lr = settings.lr
    backbone_copies = getattr(model, "backbone_copies", None)
    copies = backbone_copies() if backbone_copies is not None else []
    backbone = [p for module in (model.backbone, *copies) for p in module.parameters()]
    backbone_ids = {id(p) for p in backbone}
    head = {
        "name": "head",
        "lr": lr * settings.head_lr_multiplier,
        "params": [p for p in model.parameters() if id(p) not in backbone_ids and p.requires_grad],
    }
    loss_group = {
        "name": "loss",
        "lr": lr * settings.loss_lr_multiplier,
        "params": [p for p in loss.parameters() if p.requires_grad],
    }
    groups = [
        {"name": "backbone", "params": [p for p in backbone if p.requires_grad], "lr": lr},
        head,
        *multiplier_groups(model, head),
        loss_group,
        *multiplier_groups(loss, loss_group),
    ]
    return [g for g in groups if g["params"]]


#: Optimisers whose weight decay torch applies either to the gradient (coupled: g + λw, the default)
#: or to the weights (decoupled: w ← w − lr·λ·w, Loshchilov & Hutter 2019).
DECOUPLABLE = ("adam", "radam")


def weight_decay_kwargs(settings: OptimizerSettings) -> dict[str, Any]:
    """The weight-decay arguments of the optimiser ``settings.name`` from ``weight_decay`` (λ ≥ 0) and
    ``decoupled_weight_decay`` (None: the optimiser's own).

    Coupled decay adds λw to the gradient, so an adaptive optimiser (Adam, RAdam) divides it by the
    gradient's running RMS: where the loss gradient is small the decay step approaches lr·sign(w), far
    larger than lr·λ·w. Decoupled decay shrinks the weights by the factor (1 − lr·λ) every step,
    whatever the gradient (AdamW; the RAdam of Liu et al. that the MPN authors use).

    Without ``decoupled_weight_decay`` each optimiser keeps torch's behaviour: ``adamw`` decoupled, the
    others coupled. ``adam`` with ``decoupled_weight_decay: true`` is exactly ``adamw``.

    Raises:
        ValueError: ``adamw`` with ``decoupled_weight_decay: false`` (AdamW is always decoupled; use
            ``adam``), or ``sgd`` with ``true`` (torch's SGD only has coupled decay).
    """
    name, decoupled = settings.name, settings.decoupled_weight_decay
    kwargs: dict[str, Any] = {"weight_decay": settings.weight_decay}
    if decoupled is None:
        return kwargs
    if name in DECOUPLABLE:
        return {**kwargs, "decoupled_weight_decay": bool(decoupled)}
    if name == "adamw" and decoupled:
        return kwargs
    hint = "use adam for coupled decay" if name == "adamw" else "torch's SGD only has coupled decay"
    raise ValueError(f"training.optimizer: {name} does not take decoupled_weight_decay: {decoupled} ({hint})")


def build_optimizer(settings: OptimizerSettings, model: nn.Module, loss: nn.Module) -> torch.optim.Optimizer:
    """``training.optimizer``: ``name`` (sgd, adam, adamw, radam), ``lr``, ``weight_decay``,
    optional ``decoupled_weight_decay`` (:func:`weight_decay_kwargs`), ``momentum`` (sgd),
    ``head_lr_multiplier``, ``loss_lr_multiplier``."""
    name = settings.name
    if name not in OPTIMIZERS:
        raise ValueError(f"training.optimizer.name = {name!r} is unknown; known: {sorted(OPTIMIZERS)}")
    kwargs: dict[str, Any] = {"lr": settings.lr, **weight_decay_kwargs(settings)}
    if name == "sgd":
        kwargs["momentum"] = settings.momentum
    groups = parameter_groups(settings, model, loss)
    if name in FUSED_ON_CUDA and all(p.is_cuda for group in groups for p in group["params"]):
        kwargs["fused"] = True
    return OPTIMIZERS[name](groups, **kwargs)


def build_scheduler(
    settings: ScheduleSettings, optimizer: torch.optim.Optimizer, epochs: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``training.schedule``, stepped once per epoch: ``constant``; ``step`` (``milestones`` in
    epochs, ``gamma``); ``cosine`` (to ``min_lr_fraction`` × lr over ``epochs``)."""
    name = settings.name
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    if name == "step":
        if not settings.milestones:
            raise ValueError(
                "training.schedule.name = 'step' needs training.schedule.milestones, the epochs after "
                "which the lr is multiplied by gamma"
            )
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, list(settings.milestones), gamma=settings.gamma)
    if name == "cosine":
        floor = settings.min_lr_fraction
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda e: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * e / max(epochs, 1)))
        )
    raise ValueError(f"training.schedule.name = {name!r} is unknown; known: constant, step, cosine")
