"""pytorch-metric-learning's losses and miners as dmlbench losses: ``loss: {name: "pml:<LossClass>", ...}``.

A method's ``loss`` section may name any loss class of ``pytorch_metric_learning.losses`` with the
prefix ``pml:``; its other keys are the class's keyword arguments, and the optional key ``miner``
names a miner class of ``pytorch_metric_learning.miners`` the same way::

    loss: {name: "pml:MultiSimilarityLoss", alpha: 2, beta: 50, base: 0.5,
           miner: {name: "pml:MultiSimilarityMiner", epsilon: 0.1}}

What the adapter guarantees:

- a name is checked against ``pml:<identifier>`` and then looked up among the subclasses of PML's
  ``BaseMetricLossFunction`` (``BaseMiner`` for a miner) that the module exports; an unknown name is
  an error with the closest names;
- every key is a keyword argument of the class (or of a base class it forwards ``**kwargs`` to); an
  unknown key is an error naming it and listing the accepted ones. Values are YAML scalars or lists;
  ``distance``, ``reducer``, ``embedding_regularizer`` and ``weight_regularizer`` take a PML class of
  their own module the same way (``distance: "pml:CosineSimilarity"`` or
  ``{name: "pml:LpDistance", p: 1}``);
- ``num_classes`` and the embedding size (``embedding_size``, P2SGrad's ``descriptors_dim``) come
  from the run, never from the config; such losses own parameters
  (proxies, class weights), which the trainer gives to the optimiser's ``loss`` group
  (``lr × loss_lr_multiplier``) and saves with the checkpoint;
- the loss is computed in float32 outside autocast (PML's exponentials overflow in float16), on the
  L2-normalised embeddings, with the miner's tuples when a miner is given (else PML's default: all
  pairs or triplets of the batch).

``pytorch_metric_learning`` is imported only when a ``pml:`` loss is built. The project's own losses
(``triplet``, ``margin``, ``binomial``, ``proxy_nca``, ...) stay the defaults: they follow the papers,
where PML's versions differ (docs/losses.md).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .checks import check_batch, check_labels_in_range

__all__ = ["PML_INSTALL", "PML_PREFIX", "PMLLoss", "build_pml_loss", "is_pml_name", "pml_class_names", "pml_installed"]

PML_PREFIX = "pml:"
#: How to install pytorch-metric-learning where it is missing: the ``pml`` extra (the ``test`` extra includes it).
PML_INSTALL = "pip install -e '.[pml]' (or pip install 'pytorch-metric-learning>=2.6,<3')"
#: ``pml:`` followed by a Python identifier that starts with a letter (checked before any lookup).
_NAME = re.compile(r"pml:([A-Za-z][A-Za-z0-9_]*)")

#: kind → (PML submodule, name of its base class, what it is in messages).
_KINDS: dict[str, tuple[str, str, str]] = {
    "loss": ("losses", "BaseMetricLossFunction", "loss"),
    "miner": ("miners", "BaseMiner", "miner"),
    "distance": ("distances", "BaseDistance", "distance"),
    "reducer": ("reducers", "BaseReducer", "reducer"),
    "regularizer": ("regularizers", "BaseRegularizer", "regularizer"),
}
#: keyword arguments that take a PML object, and the kind of object.
_OBJECT_ARGUMENTS = {
    "distance": "distance",
    "reducer": "reducer",
    "embedding_regularizer": "regularizer",
    "weight_regularizer": "regularizer",
}
#: classes a subclass test admits but that cannot train on (embeddings, labels) batches.
_EXCLUDED = {
    "GenericPairLoss": "a base class of the pair losses, not a loss",
    "VICRegLoss": "self-supervised: it compares two views of a batch (ref_emb) and takes no labels",
    "ManifoldLoss": "it takes no labels",
    "EmbeddingsAlreadyPackagedAsTriplets": "it expects batches laid out as consecutive triplets, not P × K batches",
}
#: constructor arguments filled from the run: the number of training classes, the embedding size.
_FROM_RUN = {"num_classes": "num_classes", "embedding_size": "embedding_dim", "descriptors_dim": "embedding_dim"}
_FROM_RUN_WHAT = {"num_classes": "the number of training classes", "embedding_dim": "training.embedding_dim"}


def is_pml_name(name: Any) -> bool:
    """Whether ``name`` asks for a PML class (a string starting with ``pml:``)."""
    return isinstance(name, str) and name.startswith(PML_PREFIX)


def pml_installed() -> bool:
    """Whether pytorch-metric-learning can be imported (looked up, not imported)."""
    return importlib.util.find_spec("pytorch_metric_learning") is not None


def _classes(kind: str) -> dict[str, type]:
    """The usable classes of one kind: exported subclasses of its base class (the base itself excluded)."""
    module_name, base_name, _ = _KINDS[kind]
    module = importlib.import_module(f"pytorch_metric_learning.{module_name}")
    base = getattr(module, base_name)
    found = {}
    for attribute in dir(module):
        value = getattr(module, attribute)
        if (
            not attribute.startswith("_")
            and inspect.isclass(value)
            and issubclass(value, base)
            and value is not base
            and attribute not in _EXCLUDED
        ):
            found[attribute] = value
    return dict(sorted(found.items()))


def pml_class_names(kind: str = "loss") -> list[str]:
    """The class names a ``pml:`` name of ``kind`` (loss, miner, distance, reducer, regularizer) may take."""
    return list(_classes(kind))


def _resolve(name: Any, kind: str, where: str) -> type:
    """The PML class ``name`` (``pml:<Class>``) names.

    Raises:
        ValueError: a malformed name, or one that is not a usable class of this kind (closest names shown).
    """
    from dmlbench.errors import did_you_mean

    what = _KINDS[kind][2]
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"{where} = {name!r}: a pytorch-metric-learning {what} is named 'pml:<ClassName>' "
            f"(a letter, then letters, digits or underscores), e.g. 'pml:{_example(kind)}'"
        )
    if not pml_installed():
        raise ValueError(
            f"{where} = {name!r}: a pytorch-metric-learning {what} needs the package "
            f"pytorch_metric_learning, which is not installed: {PML_INSTALL}"
        )
    class_name = match.group(1)
    classes = _classes(kind)
    if class_name in classes:
        return classes[class_name]
    if class_name in _EXCLUDED:
        raise ValueError(f"{where} = {name!r} is not supported: {_EXCLUDED[class_name]}")
    hint = did_you_mean(class_name, classes)
    close = difflib.get_close_matches(class_name, list(classes), n=5, cutoff=0.5)
    close += [n for n in classes if class_name.lower() in n.lower() and n not in close][: 5 - len(close)]
    listing = f"; close names: {', '.join(close)}" if len(close) > 1 or close and not hint else ""
    raise ValueError(
        f"{where} = {name!r}: pytorch_metric_learning.{_KINDS[kind][0]} has no {what} class "
        f"{class_name!r}{hint}{listing} (`dmlbench list losses` lists them)"
    )


def _example(kind: str) -> str:
    return {
        "loss": "MultiSimilarityLoss",
        "miner": "MultiSimilarityMiner",
        "distance": "CosineSimilarity",
        "reducer": "MeanReducer",
        "regularizer": "LpRegularizer",
    }[kind]


def _keyword_arguments(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword arguments ``cls(...)`` accepts: its ``__init__``'s, then those of each base class its
    ``**kwargs`` are forwarded to (up to a class without ``**kwargs``, or ``nn.Module``). A base class's
    argument without a default is left out: the subclass sets it (GenericPairLoss's ``mat_based_loss``),
    unless the subclass hands on ``*args`` (SubCenterArcFaceLoss → ArcFaceLoss's ``num_classes``)."""
    accepted: dict[str, inspect.Parameter] = {}
    own = True
    for klass in cls.__mro__:
        if klass in (nn.Module, object):
            break
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]  # without self
        for p in parameters:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and (own or p.default is not p.empty):
                accepted.setdefault(p.name, p)
        # ``*args`` hands the positional arguments on: the next class's are as much this class's own
        own = any(p.kind is p.VAR_POSITIONAL for p in parameters)
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return accepted


def _is_plain(value: Any) -> bool:
    """A YAML scalar, or a list of them."""
    if isinstance(value, list):
        return all(_is_plain(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


def _build(spec: Any, kind: str, where: str, from_run: Mapping[str, int]) -> nn.Module:
    """Instantiate the PML class of ``spec`` (``"pml:<Class>"`` or ``{name: "pml:<Class>", **kwargs}``)."""
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise ValueError(f"{where} needs a 'name' (e.g. 'pml:{_example(kind)}'), got keys {sorted(spec)}")
        name, config = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    else:
        name, config = spec, {}
    cls = _resolve(name, kind, f"{where}.name" if isinstance(spec, Mapping) else where)
    accepted = _keyword_arguments(cls)
    injected = {key: from_run[source] for key, source in _FROM_RUN.items() if key in accepted}
    kwargs: dict[str, Any] = {}
    for key, value in config.items():
        if key in injected:
            raise ValueError(
                f"{where}: {key!r} of {name} comes from the run ({_FROM_RUN_WHAT[_FROM_RUN[key]]}); remove it"
            )
        if key not in accepted:
            settable = sorted(k for k in accepted if k not in injected)
            raise ValueError(
                f"{where}: {name} has no keyword argument {key!r}; accepted: {', '.join(settable) or '(none)'}"
            )
        if key in _OBJECT_ARGUMENTS and value is not None:
            kwargs[key] = _build(value, _OBJECT_ARGUMENTS[key], f"{where}.{key}", from_run)
        elif not _is_plain(value):
            raise ValueError(
                f"{where}.{key} = {value!r}: a keyword argument of {name} must be a number, a "
                f"boolean, a string, null or a list of them"
            )
        else:
            kwargs[key] = value
    missing = [
        p.name
        for p in accepted.values()
        if p.default is inspect.Parameter.empty and p.name not in kwargs and p.name not in injected
    ]
    if missing:
        raise ValueError(f"{where}: {name} needs {', '.join(repr(m) for m in missing)} (no default)")
    try:
        return cls(**injected, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(
            f"{where}: {name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {type(err).__name__}: {err}"
        ) from err


class PMLLoss(nn.Module):
    """A pytorch-metric-learning loss (and optional miner) with the project's loss interface.

    ``forward(embeddings (B, d), labels (B,)) -> scalar``: the batch is validated
    (:func:`~dmlbench.losses.checks.check_batch`), labels are checked against ``num_classes`` for
    losses that own per-class parameters, the miner (if any) picks the tuples, and the PML loss is
    evaluated in float32 with autocast off. A batch without any valid tuple gives 0 with a grad_fn.

    Args:
        loss: the PML loss module (its parameters, e.g. proxies, are this module's parameters).
        miner: a PML miner, or None (PML's default: every pair or triplet of the batch).
        name: the ``pml:<Class>`` name, for messages.
        num_classes: the number of classes the loss owns parameters for, or None.
    """

    def __init__(self, loss: nn.Module, miner: nn.Module | None, name: str, num_classes: int | None = None):
        super().__init__()
        self.loss = loss
        self.miner = miner
        self.name = name
        self.num_classes = num_classes

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        embeddings = check_batch(embeddings, labels)
        if self.num_classes is not None:
            check_labels_in_range(labels, self.num_classes)
        with torch.autocast(embeddings.device.type, enabled=False):
            embeddings = embeddings.float()
            indices = self.miner(embeddings, labels) if self.miner is not None else None
            value = self.loss(embeddings, labels, indices)
        if not torch.is_tensor(value):  # defensive: PML returns 0-d tensors, but never a python number here
            value = torch.as_tensor(float(value), device=embeddings.device)
        if not value.requires_grad and embeddings.requires_grad:
            value = value + 0.0 * embeddings.sum()
        return value

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


def build_pml_loss(config: Mapping[str, Any], num_classes: int, embedding_dim: int, where: str = "loss") -> PMLLoss:
    """The :class:`PMLLoss` of a loss config ``{name: "pml:<LossClass>", miner: ..., **kwargs}``.

    Args:
        config: the loss section; ``miner`` (optional) is ``"pml:<MinerClass>"`` or
            ``{name: "pml:<MinerClass>", **kwargs}``.
        num_classes: number of (contiguous) training classes, for losses with ``num_classes``.
        embedding_dim: the embedding size, for losses with ``embedding_size`` (or its other names).
        where: the config key, for messages.

    Raises:
        ValueError: an unknown class (with the closest names), an unknown keyword argument (named, with the
            accepted ones), a value of the wrong kind, a missing required argument, or the class's own error.
    """
    from_run = {"num_classes": num_classes, "embedding_dim": embedding_dim}
    loss_config = {k: v for k, v in config.items() if k != "miner"}
    loss = _build(loss_config, "loss", where, from_run)
    miner_spec = config.get("miner")
    miner = _build(miner_spec, "miner", f"{where}.miner", from_run) if miner_spec is not None else None
    owns_classes = "num_classes" in _keyword_arguments(type(loss))
    return PMLLoss(loss, miner, str(config["name"]), num_classes if owns_classes else None)
