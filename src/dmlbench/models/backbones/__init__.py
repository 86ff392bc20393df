"""Backbone registry: ``training.backbone.name`` → builder.

A builder takes the remaining keys of the ``training.backbone`` section as
keyword arguments and returns a :class:`StagedBackbone`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dmlbench.models.backbones.base import StagedBackbone, freeze_batchnorm
from dmlbench.models.backbones.bninception import build_bninception
from dmlbench.models.backbones.efficientnet_lite import build_efficientnet_lite0
from dmlbench.models.backbones.googlenet import build_googlenet
from dmlbench.models.backbones.resnet import build_resnet50
from dmlbench.models.backbones.small_cnn import build_small_cnn

BACKBONES: dict[str, Callable[..., StagedBackbone]] = {
    "small_cnn": build_small_cnn,
    "googlenet": build_googlenet,
    "bninception": build_bninception,
    "resnet50": build_resnet50,
    "efficientnet_lite0": build_efficientnet_lite0,
}

#: keys of ``training.backbone`` handled by the model, not passed to the builder.
MODEL_KEYS = ("name", "freeze_bn", "frozen_through")


def check_backbone_name(name: Any) -> None:
    """KeyError naming ``training.backbone.name`` and the known names unless ``name`` is registered."""
    if name not in BACKBONES:
        raise KeyError(f"training.backbone.name = {name!r} is unknown; known: {sorted(BACKBONES)}")


def build_backbone(config: Mapping[str, Any]) -> StagedBackbone:
    """Build the backbone named by ``config['name']`` with the other keys as arguments.

    ``frozen_through`` (a stage name, or null) fixes the stages up to it
    (:meth:`StagedBackbone.freeze_through`), after any pretrained weights are loaded.

    A key set to null is left out (the builder's default applies), so an overlay
    that switches backbones can unset the previous backbone's options (e.g. ``width: null``).
    """
    name = config.get("name")
    check_backbone_name(name)
    kwargs = {k: v for k, v in config.items() if k not in MODEL_KEYS and v is not None}
    try:
        backbone = BACKBONES[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"training.backbone ({name}): {err}") from err
    frozen_through = config.get("frozen_through")
    if frozen_through is not None:
        try:
            backbone.freeze_through(frozen_through)
        except KeyError as err:
            raise ValueError(f"training.backbone.frozen_through: {err.args[0]}") from err
    return backbone


__all__ = ["BACKBONES", "StagedBackbone", "build_backbone", "check_backbone_name", "freeze_batchnorm"]
