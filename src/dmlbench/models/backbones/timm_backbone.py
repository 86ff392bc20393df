"""timm models as staged backbones: ``training.backbone: {name: "timm:<model>", ...}``.

``<model>`` is any name of ``timm.list_models()``, optionally with a pretrained tag
(``timm:resnet18``, ``timm:resnet18.a1_in1k``). timm is an optional dependency
(``pip install 'dmlbench[timm]'``), imported only when such a backbone is checked or built.

**Stages (cut points).** Where the model exposes its stages (timm's ``feature_info``, the stages
``features_only=True`` returns) and runs them in the order they are registered, each stage is a
named cut point: its name is timm's module name with ``.`` → ``_`` (``act1``, ``layer1`` …
``layer4`` for ResNets; ``blocks_0`` … for EfficientNets and MobileNets), followed by the layers
``forward_features`` applies after the last one (EfficientNet's ``conv_head`` + ``bn2``, a stage
named after its first module) and ``pool`` = timm's own ``forward_head(pre_logits=True)`` (global
pooling, and for MobileNetV3 its pre-logits projection), so the ``pool`` output has the model's
``num_features`` (``head_hidden_size``) dimensions. A model whose forward pass is not such a
sequence (ViTs add position embeddings between modules; NHWC models) gets two stages,
``features`` (``forward_features``) and ``pool``: it trains with any recipe that needs no cut
point, and a recipe or ``frozen_through`` that names another stage gets the stage-name error
listing the two. The split is checked when the backbone is built: the stages, run one after the
other, must reproduce ``forward_features`` and ``forward_head`` on a fixed input.

**Input.** RGB in [0, 1]; ``normalize`` applies the model's own mean/std (its pretrained config).
``pooling``: ``avg`` or ``max`` (timm's ``global_pool``), or null for the model's own (a ViT's
class token).

**Weights** (``pretrained``), never downloaded at run time:

- ``null`` / ``false``: timm's random initialisation;
- ``timm``: the model's default (or named) pretrained weights from timm's own cache — the Hugging
  Face hub cache (``$HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``) or, for weights
  published only by URL, the torch hub cache (``$TORCH_HOME/hub/checkpoints``). Nothing is fetched:
  the model is always created with ``pretrained=False`` and the file read here (and
  ``HF_HUB_OFFLINE=1`` is set before timm is imported); a missing entry is an error that says how
  to fetch it once;
- a local file (a path, ``~`` and ``$VARS`` expanded, or ``{path, sha256}``; optional
  ``weights_sha256``): a ``.safetensors`` file or a ``torch.save``-d state dict of the same timm
  model (what timm's hub files hold, or ``model.state_dict()``), read with
  ``weights_only=True``. Its keys must match the model's exactly, up to the classifier (timm's
  ``pretrained_cfg['classifier']``), which is dropped; any mismatch is an error listing the keys.

Files are checksummed as every weights file of the project (:mod:`.weights`): a hub cache file
against its blob name (the sha256 the hub stores it under), a torch hub file against the hash
prefix of its name, a local file against the given sha256 (else a warning prints it).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import torch
from torch import nn

from dmlbench.models.backbones.base import InputNormalization, StagedBackbone
from dmlbench.models.backbones.weights import (
    PRETRAINING_SOURCES,
    PretrainedWeightsError,
    RemoteFile,
    WeightLayout,
    WeightsFile,
    check_sha256,
    hub_checkpoint_dir,
    load_state,
    read_checkpoint,
    resolve_weights,
)

__all__ = [
    "TIMM_PREFIX",
    "build_timm_backbone",
    "check_timm_name",
    "check_timm_pretrained",
    "is_timm_name",
    "timm_model_count",
]

TIMM_PREFIX = "timm:"
#: ``timm:<architecture>[.<pretrained tag>]``, lower case as every timm name (checked before any lookup).
_NAME = re.compile(r"timm:([a-z0-9_]+)(?:\.([a-z0-9_]+))?")
#: ``pretrained`` value that means timm's own cache.
TIMM_CACHE = "timm"
#: side of the square input on which the stage split is checked (the model's own size if it needs one).
CHECK_SIZE = 64
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
_INSTALL = "pip install 'dmlbench[timm]' (or pip install 'timm>=1.0,<2')"


def is_timm_name(name: Any) -> bool:
    """Whether ``name`` asks for a timm model (a string starting with ``timm:``)."""
    return isinstance(name, str) and name.startswith(TIMM_PREFIX)


def _timm() -> ModuleType:
    """timm, imported with the Hugging Face hub offline (nothing is ever downloaded)."""
    if importlib.util.find_spec("timm") is None:
        raise ValueError(f"training.backbone.name: timm: backbones need the timm package: {_INSTALL}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    import timm

    return timm


def timm_model_count() -> int | None:
    """How many model names timm offers (None when timm is not installed)."""
    if importlib.util.find_spec("timm") is None:
        return None
    return len(_timm().list_models())


def check_timm_name(name: Any) -> str:
    """The timm model name (``<arch>[.<tag>]``) of ``timm:<model>``.

    Raises:
        ValueError: a malformed name, timm missing, or a model or tag timm does not know (closest shown).
    """
    from dmlbench.errors import did_you_mean

    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"training.backbone.name = {name!r}: a timm model is named 'timm:<model>' with timm's "
            f"lower-case model name and an optional pretrained tag, e.g. 'timm:resnet18' or "
            f"'timm:resnet18.a1_in1k'"
        )
    arch, tag = match.groups()
    timm = _timm()
    if not timm.is_model(arch):
        raise ValueError(
            f"training.backbone.name = {name!r}: timm has no model {arch!r}"
            f"{did_you_mean(arch, timm.list_models())} (`dmlbench list backbones`; "
            f"timm.list_models('*pattern*') searches)"
        )
    model = arch if tag is None else f"{arch}.{tag}"
    if tag is not None:
        tags = [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")]
        if tag not in tags:
            raise ValueError(
                f"training.backbone.name = {name!r}: timm has no pretrained tag {tag!r} for {arch}"
                f"{did_you_mean(tag, tags)}; known: {', '.join(tags) or '(none)'}"
            )
    return model


class _TimmForwards(Protocol):
    """The two methods every timm model has besides ``forward`` (the stages call them)."""

    def forward_features(self, x: torch.Tensor) -> torch.Tensor: ...

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor: ...


def _pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    """The ``pretrained_cfg`` dict timm sets on every model it creates."""
    return cast(dict[str, Any], model.pretrained_cfg)


# --- weights ----------------------------------------------------------------------------------------------


def _layout(name: str, model: nn.Module) -> WeightLayout:
    """The model's own key layout; the classifier keys of a checkpoint are skipped."""
    cfg = _pretrained_cfg(model)
    classifier = cfg.get("classifier") or ()
    classifiers = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    return WeightLayout(
        name=f"timm {cfg.get('architecture', name)}",
        backbone=name,
        checkpoint_key=lambda key: key,
        ignored_prefixes=tuple(f"{c}." for c in classifiers),
    )


def _fetch_hint(model_name: str) -> str:
    return (
        f"dmlbench never downloads weights at run time; fetch them once, on a machine with network access, "
        f"into timm's cache with\n  python -c \"import timm; timm.create_model('{model_name}', pretrained=True)\"\n"
        f"(copy ~/.cache/huggingface/hub along if the runs are elsewhere), or set training.backbone.pretrained "
        f"to a local .safetensors or state-dict file of this model"
    )


def _cached_file(name: str, model: nn.Module) -> WeightsFile:
    """The model's pretrained file in timm's cache (Hugging Face hub cache, else torch hub cache)."""
    cfg = _pretrained_cfg(model)
    model_name = f"{cfg.get('architecture')}.{cfg.get('tag')}" if cfg.get("tag") else str(cfg.get("architecture"))
    looked: list[str] = []
    hub_id = cfg.get("hf_hub_id")
    if hub_id:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE

        repo, _, revision = hub_id.partition("@")
        filenames = (
            [cfg["hf_hub_filename"]] if cfg.get("hf_hub_filename") else ["model.safetensors", "pytorch_model.bin"]
        )
        for filename in filenames:
            found = try_to_load_from_cache(repo, filename, revision=revision or None)
            if isinstance(found, str) and Path(found).is_file():
                blob = Path(found).resolve().name
                return WeightsFile(
                    Path(found),
                    blob if _SHA256_NAME.fullmatch(blob) else None,
                    f"pretrained: timm ({hub_id}/{filename})",
                )
        looked.append(f"the Hugging Face hub cache {HF_HUB_CACHE} ({repo}: {' or '.join(filenames)})")
    if cfg.get("url"):
        remote = RemoteFile(cfg["url"])
        path = hub_checkpoint_dir() / remote.filename
        if path.is_file():
            return WeightsFile(path, remote.hash_prefix, f"pretrained: timm ({remote.url})")
        looked.append(f"the torch hub cache ({path})")
    if not looked:
        raise PretrainedWeightsError(
            f"training.backbone: {name}: timm publishes no pretrained weights for "
            f"{model_name}; set pretrained to null or to a local weights file"
        )
    raise PretrainedWeightsError(
        f"training.backbone: {name}: pretrained: timm, but the weights of {model_name} are "
        f"not in timm's cache (looked in {' and '.join(looked)}). {_fetch_hint(model_name)}"
    )


def _read_state(weights: WeightsFile) -> dict[str, torch.Tensor]:
    """A state dict from a ``.safetensors`` file or a ``torch.save``-d one (checksummed first)."""
    if weights.path.suffix != ".safetensors":
        return read_checkpoint(weights)
    check_sha256(weights)
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(weights.path), device="cpu"))
    except Exception as err:  # safetensors raises its own error types for a bad file
        raise PretrainedWeightsError(
            f"{weights.path}: cannot be read as a safetensors file ({type(err).__name__}: {err})"
        ) from err


def check_timm_pretrained(name: str, spec: Any, sha256: str | None = None) -> None:
    """Raise PretrainedWeightsError for a ``pretrained`` value a timm model cannot take (no file is read):
    the project's own sources (``imagenet``, ``package``, a pretraining stage), or ``weights_sha256`` with
    ``pretrained: timm``."""
    if spec == TIMM_CACHE and sha256:
        raise PretrainedWeightsError(
            f"training.backbone: {name}: weights_sha256 applies to local paths; "
            f"timm's cache files are checked against their own hashes"
        )
    own_source = isinstance(spec, str) and (
        spec in ("imagenet", "package", *PRETRAINING_SOURCES) or spec.startswith("imagenet:")
    )
    if own_source or spec is True:
        raise PretrainedWeightsError(
            f"training.backbone: {name}: pretrained: {spec!r} is not a source of a timm model's weights; it "
            f"takes null/false (random init), 'timm' (timm's cache: the tag in the name, e.g. "
            f"timm:resnet18.a1_in1k, else the model's default weights), or a local weights file"
        )


def _weights_file(name: str, model: nn.Module, spec: Any, sha256: str | None) -> WeightsFile | None:
    """The file ``pretrained`` names for a timm model, or None for random initialisation."""
    check_timm_pretrained(name, spec, sha256)
    if spec == TIMM_CACHE:
        return _cached_file(name, model)
    return resolve_weights(spec, _layout(name, model), sha256)


# --- stages -----------------------------------------------------------------------------------------------


class _TimmPart(nn.Module):
    """Runs one method of a shallow copy of a timm model that holds only some of its children."""

    def __init__(self, net: nn.Module, method: str):
        super().__init__()
        self.net = net
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        net = cast(_TimmForwards, self.net)
        if self.method == "forward_head":
            return net.forward_head(x, pre_logits=True)
        return net.forward_features(x)

    def extra_repr(self) -> str:
        return f"{type(self.net).__name__}.{self.method}"


def _part(model: nn.Module, children: list[str], with_own_tensors: bool) -> nn.Module:
    """A shallow copy of ``model`` whose only children are ``children`` (its methods and settings kept).

    ``with_own_tensors``: keep the parameters and buffers registered on the model itself (a ViT's
    position embedding and class token), else drop them.
    """
    import copy

    part = copy.copy(model)
    part._modules = OrderedDict((n, m) for n, m in model._modules.items() if n in children or m is None)
    part._parameters = OrderedDict(model._parameters) if with_own_tensors else OrderedDict()
    part._buffers = OrderedDict(model._buffers) if with_own_tensors else OrderedDict()
    part._non_persistent_buffers_set = set(model._non_persistent_buffers_set) if with_own_tensors else set()
    for hooks in (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
    ):
        if hasattr(part, hooks):
            setattr(part, hooks, OrderedDict())
    return part


def _units(model: nn.Module, feature_modules: list[str]) -> list[tuple[str, nn.Module]]:
    """The model's children in registration order; a Sequential holding a feature module is opened one level
    (as timm's ``features_only`` does: ``blocks.0`` becomes a unit of its own)."""
    units = []
    for name, child in model.named_children():
        if isinstance(child, nn.Sequential) and any(f.startswith(f"{name}.") for f in feature_modules):
            units += [(f"{name}.{sub}", module) for sub, module in child.named_children()]
        else:
            units.append((name, child))
    return units


@contextmanager
def _calls(modules: list[tuple[str, nn.Module]]) -> Iterator[list[str]]:
    """The names of ``modules`` in the order they are called inside the block."""
    called: list[str] = []
    handles = [module.register_forward_hook(lambda *_, name=name: called.append(name)) for name, module in modules]
    try:
        yield called
    finally:
        for handle in handles:
            handle.remove()


def _check_input(model: nn.Module) -> torch.Tensor:
    """A fixed (1, 3, s, s) input (its own RNG: the global one is left alone)."""
    size = CHECK_SIZE
    cfg = _pretrained_cfg(model)
    fixed = cfg.get("fixed_input_size") or getattr(getattr(model, "patch_embed", None), "strict_img_size", False)
    if fixed:
        size = int(cfg.get("input_size", (3, 224, 224))[-1])
    generator = torch.Generator().manual_seed(0)
    return torch.rand(1, 3, size, size, generator=generator)


def _same(a: Any, b: Any) -> bool:
    return (
        torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    )


def _run(stages: Mapping[str, nn.Module], x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
    outputs: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, stage in stages.items():
        x = stage(x)
        outputs[name] = x
    return outputs


def _sequential_stages(
    model: nn.Module, head: nn.Module, x: torch.Tensor, features: torch.Tensor, pooled: torch.Tensor
) -> OrderedDict[str, nn.Module] | None:
    """Named stages from ``feature_info`` (+ the rest of ``forward_features``, + ``pool``), or None when the
    model does not run as that sequence of modules (checked on ``x`` against ``features`` and ``pooled``)."""
    info = getattr(model, "feature_info", None)
    own_tensors = [*model.parameters(recurse=False), *model.buffers(recurse=False)]
    if not info or own_tensors:
        return None
    feature_modules = [str(f["module"]) for f in info]
    channels = {f["module"]: f["num_chs"] for f in info}
    units = _units(model, feature_modules)
    names = [n for n, _ in units]
    if len(set(feature_modules)) != len(feature_modules) or not all(f in names for f in feature_modules):
        return None
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    group: list[tuple[str, nn.Module]] = []
    last = max(names.index(f) for f in feature_modules)
    for name, module in units[: last + 1]:
        group.append((name, module))
        if name in channels:
            stages[name.replace(".", "_")] = nn.Sequential(OrderedDict((n.replace(".", "_"), m) for n, m in group))
            group = []
    leftover = units[last + 1 :]
    with torch.no_grad(), _calls(leftover) as called:
        cast(_TimmForwards, model).forward_features(x)
    tail = [(n, m) for n, m in leftover if n in called]
    tail.sort(key=lambda unit: called.index(unit[0]))
    if tail:
        tail_name = tail[0][0].replace(".", "_")
        if tail_name in stages or tail_name == "pool":
            return None
        stages[tail_name] = nn.Sequential(OrderedDict((n.replace(".", "_"), m) for n, m in tail))
    stages["pool"] = head
    try:
        with torch.no_grad():
            outputs = _run(stages, x)
    except Exception:  # noqa: BLE001 - any failure means "not a sequence of its modules"
        return None
    spatial = [n.replace(".", "_") for n in feature_modules]
    if any(outputs[n].ndim != 4 or outputs[n].shape[1] != channels[f] for n, f in zip(spatial, feature_modules)):
        return None  # channels-last (NHWC) stages: not the (B, C, H, W) maps the cut points expect
    before_pool = list(outputs.values())[-2]
    if not (_same(before_pool, features) and _same(outputs["pool"], pooled)):
        return None
    return stages


def _channels(output: torch.Tensor) -> int:
    """Channels of a stage output: (B, C, H, W) or (B, C) → C; tokens (B, N, C) → C."""
    return int(output.shape[-1] if output.ndim == 3 else output.shape[1])


def build_timm_backbone(
    name: str, pretrained: Any = None, weights_sha256: str | None = None, pooling: str | None = None
) -> StagedBackbone:
    """A timm model as named stages: ``feature_info``'s stages (+ the rest of ``forward_features``), ``pool``.

    Args:
        name: ``timm:<model>[.<tag>]``.
        pretrained: null/false (random init), ``timm`` (timm's cache, never downloaded), or a local
            ``.safetensors`` / state-dict file (path or ``{path, sha256}``).
        weights_sha256: expected sha256 of a local weights file.
        pooling: 'avg' or 'max': timm's global pooling of the ``pool`` stage; None: the model's own
            (average for CNNs, the class token for ViTs).

    Raises:
        ValueError: an unknown model or tag, timm missing, a bad ``pooling``, or a model that cannot be
            split into features and pooling.
        PretrainedWeightsError: weights not in the cache, a missing or mismatched local file.
    """
    model_name = check_timm_name(name)
    if pooling not in (None, "avg", "max"):
        raise ValueError(f"training.backbone.pooling must be 'avg', 'max' or null (the model's own), got {pooling!r}")
    timm = _timm()
    model = timm.create_model(
        model_name, pretrained=False, num_classes=0, **({"global_pool": pooling} if pooling is not None else {})
    )
    weights = _weights_file(name, model, pretrained, weights_sha256)
    if weights is not None:
        load_state(model, _read_state(weights), _layout(name, model), str(weights.path))
    was_training = model.training
    model.eval()
    x = _check_input(model)
    children = list(model.named_children())
    with torch.no_grad():
        with _calls(children) as in_features:
            features = model.forward_features(x)
        with _calls(children) as in_head:
            pooled = model.forward_head(features, pre_logits=True)
    head_children = sorted(set(in_head))
    if set(head_children) & set(in_features) or pooled.ndim != 2:
        raise ValueError(
            f"training.backbone.name = {name!r}: this timm model cannot be split into features and "
            f"pooling (its head reuses feature layers or does not return a vector)"
        )
    head = _TimmPart(_part(model, head_children, with_own_tensors=False), "forward_head")
    stages = _sequential_stages(model, head, x, features, pooled)
    if stages is None:
        rest = [n for n, _ in children if n not in head_children]
        stages = OrderedDict(
            features=_TimmPart(_part(model, rest, with_own_tensors=True), "forward_features"), pool=head
        )
        with torch.no_grad():
            outputs = _run(stages, x)
        if not _same(outputs["pool"], pooled):
            raise ValueError(
                f"training.backbone.name = {name!r}: this timm model cannot be split into features "
                f"and pooling (its forward pass uses more than its layers)"
            )
    else:
        with torch.no_grad():
            outputs = _run(stages, x)
    channels = {n: _channels(o) for n, o in outputs.items()}
    if "features" in channels:  # forward_features' output may be tokens or channels-last: the model says
        channels["features"] = int(model.num_features)
    mean = model.pretrained_cfg.get("mean") or timm.data.IMAGENET_DEFAULT_MEAN
    std = model.pretrained_cfg.get("std") or timm.data.IMAGENET_DEFAULT_STD
    backbone = StagedBackbone(InputNormalization(mean, std), stages, channels)
    backbone.train(was_training)
    return backbone
