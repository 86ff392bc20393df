"""Build a loss from its config: ``{"name": <loss>, **hyperparameters}``.

``<loss>`` is one of :data:`LOSS_NAMES` (the project's paper-exact losses) or ``pml:<LossClass>``, a
loss class of pytorch-metric-learning through :mod:`dmlbench.losses.pml_adapter` (imported only then).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from dmlbench.registry import Registry

from .binomial import BinomialDevianceLoss
from .contrastive import ContrastiveLoss
from .margin import DistanceWeightedMarginLoss
from .norm_softmax import NormalizedSoftmaxLoss
from .proxy_nca import ProxyNCALoss
from .triplet import SemiHardTripletLoss

__all__ = ["LOSS_CLASSES", "LOSS_NAMES", "build_loss", "loss_defaults"]

#: the built-in loss classes by name.
LOSS_CLASSES: Registry[type[nn.Module]] = Registry(
    "loss name",
    {
        "contrastive": ContrastiveLoss,
        "triplet": SemiHardTripletLoss,
        "margin": DistanceWeightedMarginLoss,
        "binomial": BinomialDevianceLoss,
        "proxy_nca": ProxyNCALoss,
        "norm_softmax": NormalizedSoftmaxLoss,
    },
    alternative="'pml:<LossClass>' for a pytorch-metric-learning loss (`dmlbench list losses`)",
)
LOSS_NAMES: tuple[str, ...] = tuple(LOSS_CLASSES)


def loss_defaults(name: str) -> dict[str, Any]:
    """The hyperparameters of a built-in loss with their default values.

    The hyperparameters are the keyword-only arguments of the loss class.

    Raises:
        UnknownNameError: unknown loss name (a ``ValueError``; the message lists the known ones).
    """
    parameters = inspect.signature(LOSS_CLASSES.lookup(name)).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _check_type(name: str, key: str, value: Any, default: Any) -> Any:
    """Return ``value`` coerced to the type of ``default``, or raise ValueError naming ``key``."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ValueError(f"loss {name!r}: hyperparameter {key!r} must be a {type(default).__name__}, got {value!r}")


def build_loss(config: Mapping[str, Any], num_classes: int, embedding_dim: int) -> nn.Module:
    """Instantiate a loss.

    Args:
        config: ``{"name": <one of LOSS_NAMES>, **hyperparameters}``; missing
            hyperparameters take their defaults (:func:`loss_defaults`). Or
            ``{"name": "pml:<LossClass>", "miner": ..., **kwargs}``
            (:func:`~dmlbench.losses.pml_adapter.build_pml_loss`).
        num_classes: number of (contiguous) training classes.
        embedding_dim: dimension of the embeddings the loss receives.

    Returns:
        The loss module: ``forward(embeddings (B, d), labels (B,)) -> scalar``.
        Its parameters (proxies, class weights, β), if any, must be given to
        the optimiser.

    Raises:
        ValueError: missing ``name``, unknown name, unknown hyperparameter or
            wrongly typed value; the message names the key and lists the
            allowed ones. Out-of-range values raise from the loss itself.
    """
    if "name" not in config:
        raise ValueError(f"loss config is missing the key 'name'; allowed names: {', '.join(LOSS_NAMES)}")
    name = config["name"]
    if isinstance(name, str) and name.startswith("pml:"):
        from .pml_adapter import build_pml_loss

        return build_pml_loss(config, num_classes=num_classes, embedding_dim=embedding_dim)
    defaults = loss_defaults(name)
    hyperparameters = {}
    for key, value in config.items():
        if key == "name":
            continue
        if key == "miner":
            raise ValueError(
                f"loss {name!r}: 'miner' applies to pml: losses only (the project's losses "
                f"choose their tuples as their papers do)"
            )
        if key not in defaults:
            raise ValueError(
                f"loss {name!r}: unknown hyperparameter {key!r}; allowed: {', '.join(defaults) or '(none)'}"
            )
        hyperparameters[key] = _check_type(name, key, value, defaults[key])
    cls = LOSS_CLASSES[name]
    # Constructor arguments that come from the data/model, not from the config.
    injected = {"num_classes": num_classes, "embedding_dim": embedding_dim}
    wanted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in injected.items() if k in wanted}, **hyperparameters)
