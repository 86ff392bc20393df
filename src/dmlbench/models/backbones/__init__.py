"""Backbone registry: ``training.backbone.name`` → builder.

A builder takes the remaining keys of the ``training.backbone`` section as
keyword arguments and returns a :class:`StagedBackbone`. Besides the registered
names, ``timm:<model>`` builds a timm model (:mod:`.timm_backbone`; timm is
imported only then).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from dmlbench.models.backbones.base import StagedBackbone, freeze_batchnorm
from dmlbench.models.backbones.bninception import build_bninception
from dmlbench.models.backbones.efficientnet_lite import build_efficientnet_lite0
from dmlbench.models.backbones.googlenet import build_googlenet
from dmlbench.models.backbones.resnet import build_resnet50
from dmlbench.models.backbones.small_cnn import build_small_cnn
from dmlbench.registry import Registry

BACKBONES: Registry[Callable[..., StagedBackbone]] = Registry(
    "backbone",
    {
        "small_cnn": build_small_cnn,
        "googlenet": build_googlenet,
        "bninception": build_bninception,
        "resnet50": build_resnet50,
        "efficientnet_lite0": build_efficientnet_lite0,
    },
    alternative="'timm:<model>' for a timm model",
)

#: keys of ``training.backbone`` handled by the model, not passed to the builder.
MODEL_KEYS = ("name", "freeze_bn", "frozen_through")


def check_backbone_name(name: Any) -> str:
    """``name``, checked: :class:`~dmlbench.registry.UnknownNameError` (a KeyError) naming
    ``training.backbone.name`` and the known names unless ``name`` is registered; for ``timm:<model>``,
    ValueError unless timm is installed and knows the model (and tag)."""
    if isinstance(name, str) and name.startswith("timm:"):
        from dmlbench.models.backbones.timm_backbone import check_timm_name

        check_timm_name(name)
        return name
    return BACKBONES.check(name, key="training.backbone.name")


def check_backbone(config: Mapping[str, Any]) -> None:
    """What can be checked of a ``training.backbone`` section without building it or reading a file: the
    name (:func:`check_backbone_name`) and, for a timm model, that ``pretrained`` is a source it can take.

    Raises:
        KeyError, ValueError: naming the key and the problem.
    """
    name = config.get("name")
    check_backbone_name(name)
    if isinstance(name, str) and name.startswith("timm:"):
        from dmlbench.models.backbones.timm_backbone import check_timm_pretrained

        check_timm_pretrained(name, config.get("pretrained"), config.get("weights_sha256"))


def build_backbone(config: Mapping[str, Any]) -> StagedBackbone:
    """Build the backbone named by ``config['name']`` with the other keys as arguments.

    ``frozen_through`` (a stage name, or null) fixes the stages up to it
    (:meth:`StagedBackbone.freeze_through`), after any pretrained weights are loaded.

    A key set to null is left out (the builder's default applies), so an overlay
    that switches backbones can unset the previous backbone's options (e.g. ``width: null``).
    """
    name = check_backbone_name(config.get("name"))
    kwargs = {k: v for k, v in config.items() if k not in MODEL_KEYS and v is not None}
    build: Callable[..., StagedBackbone]
    if name.startswith("timm:"):
        from dmlbench.models.backbones.timm_backbone import build_timm_backbone

        build = functools.partial(build_timm_backbone, name)
    else:
        build = BACKBONES[name]
    try:
        backbone = build(**kwargs)
    except TypeError as err:
        raise ValueError(f"training.backbone ({name}): {err}") from err
    frozen_through = config.get("frozen_through")
    if frozen_through is not None:
        try:
            backbone.freeze_through(frozen_through)
        except KeyError as err:
            raise ValueError(f"training.backbone.frozen_through: {err.args[0]}") from err
    return backbone


__all__ = ["BACKBONES", "StagedBackbone", "build_backbone", "check_backbone", "check_backbone_name", "freeze_batchnorm"]
